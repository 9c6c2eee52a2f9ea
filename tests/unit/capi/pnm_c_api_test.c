/* SPDX-License-Identifier: MIT */
/*
 * The near-memory C API (cxlkv/cxlkv_pnm.h): a writer appends a long
 * context, a reader on the same pool finds it and runs a decode step whose
 * output with the whole context as budget equals attention over all pages;
 * merge of two partials; the pnm metrics family in cxlkv_stats_prometheus();
 * bad input refused with -errno and a message.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxlkv/cxlkv.h"
#include "cxlkv/cxlkv_pnm.h"
#include "support/c_check.h"

#define MiB (1024ull * 1024ull)
#define L 2
#define H 2
#define QH 4
#define D 16
#define N 100

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return ((float)((*s >> 8) & 0xffff) / 65536.0f) - 0.5f;
}

int main(void)
{
	char uri[96], shmname[96];
	struct cxlkv_format_opts fo;
	struct cxlkv_pool *pool = NULL;
	struct cxlkv_pnm_store *ws = NULL, *rs = NULL;
	struct cxlkv_pnm_context *w = NULL, *r = NULL;
	struct cxlkv_pnm_engine *eng = NULL;
	struct cxlkv_pnm_store_opts so;
	struct cxlkv_pnm_geometry g, got;
	struct cxlkv_pnm_step_opts st;
	struct cxlkv_pnm_step_stats stats;
	static float k[L * H * N * D], v[L * H * N * D], q[L * QH * D];
	static float out_sel[L * QH * D], lse_sel[L * QH], out_all[L * QH * D], lse_all[L * QH];
	static float out_m[L * QH * D], lse_m[L * QH];
	static uint32_t pages[L * H * 16], counts[L * H];
	unsigned seed = 7;
	int i;

	snprintf(uri, sizeof uri, "shm:cxlkv-pnm-capi-%d:%llu", (int)getpid(), 32 * MiB);
	memset(&fo, 0, sizeof fo);
	fo.size = sizeof fo;
	fo.max_nodes = 4;
	fo.flags = CXLKV_FORMAT_F_NO_STANDARD; /* room for the pnm carve */
	CHECK(cxlkv_pool_format(uri, &fo) == 0);
	CHECK(cxlkv_pool_open(uri, &pool) == 0);
	if (!pool)
		return 1;

	memset(&so, 0, sizeof so);
	so.size = sizeof so;
	so.carve_bytes = 8 * MiB;
	so.partitions = 2;
	so.slots_per_partition = 4;
	CHECK(cxlkv_pnm_store_open(pool, &so, &ws) == 0);
	so.flags = CXLKV_PNM_STORE_F_READONLY;
	CHECK(cxlkv_pnm_store_open(pool, &so, &rs) == 0);

	memset(&g, 0, sizeof g);
	g.size = sizeof g;
	g.layers = L;
	g.kv_heads = H;
	g.head_dim = D;
	g.dtype = CXLKV_PNM_DTYPE_F32;
	g.max_tokens = 256;
	CHECK(cxlkv_pnm_create(ws, 77, &g, &w) == 0);
	CHECK_ERR(cxlkv_pnm_create(rs, 78, &g, &r), -EPERM);
	for (i = 0; i < L * H * N * D; i++) {
		k[i] = frand(&seed);
		v[i] = frand(&seed);
	}
	for (i = 0; i < L * QH * D; i++)
		q[i] = 4 * frand(&seed);
	CHECK(cxlkv_pnm_append(w, k, v, N) == 0);

	CHECK(cxlkv_pnm_find(rs, 77, &r) == 0);
	CHECK_ERR(cxlkv_pnm_find(rs, 99, &r), -ENOENT);
	CHECK(cxlkv_pnm_find(rs, 77, &r) == 0);
	CHECK(cxlkv_pnm_refresh(r) == N);
	memset(&got, 0, sizeof got);
	got.size = sizeof got;
	CHECK(cxlkv_pnm_geometry_of(r, &got) == 0);
	CHECK(got.page_tokens == 16 && got.head_dim == D && got.max_tokens == 256);
	CHECK(got.digest == CXLKV_PNM_DIGEST_MINMAX_ROWS && got.group_pages == 1); /* 16 pages: one level */

	CHECK(cxlkv_pnm_engine_create(2, -1, &eng) == 0);
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	st.token_budget = 1u << 20; /* the whole context */
	st.sink_pages = 1;
	st.local_pages = 1;
	memset(&stats, 0, sizeof stats);
	stats.size = sizeof stats;
	CHECK(cxlkv_pnm_attend(r, eng, q, QH, 0, &st, out_sel, lse_sel, &stats) == 0);
	CHECK(stats.ntokens == N);
	CHECK(stats.selected_pages == L * H * 7); /* 100 tokens = 7 pages of 16 */
	CHECK(stats.link_bytes_near < stats.link_bytes_selected);
	st.flags = CXLKV_PNM_STEP_F_ALL_PAGES;
	CHECK(cxlkv_pnm_attend(r, NULL, q, QH, N, &st, out_all, lse_all, NULL) == 0);
	for (i = 0; i < L * QH * D; i++)
		CHECK(fabsf(out_sel[i] - out_all[i]) < 1e-6f);

	/* Selection alone, 2 pages of budget: sink + local. */
	st.flags = 0;
	st.token_budget = 32;
	CHECK(cxlkv_pnm_select(r, q, QH, 0, &st, pages, 16, counts) == 0);
	for (i = 0; i < L * H; i++)
		CHECK(counts[i] == 2 && pages[i * 16] == 0 && pages[i * 16 + 1] == 6);
	CHECK_ERR(cxlkv_pnm_select(r, q, QH, 0, &st, pages, 1, counts), -ENOSPC);

	/* Merge with an empty partial is the identity. */
	for (i = 0; i < L * QH; i++)
		lse_m[i] = -INFINITY;
	memset(out_m, 0, sizeof out_m);
	CHECK(cxlkv_pnm_merge(L * QH, D, out_all, lse_all, out_m, lse_m, out_m, lse_m) == 0);
	for (i = 0; i < L * QH * D; i++)
		CHECK(fabsf(out_m[i] - out_all[i]) < 1e-6f);

	/* The pnm metrics family reaches the pool's exposition (the text of
	 * cxlkvctl stats --prometheus): the writer's append and a step on the
	 * writer's handle count in its partition; the reader store's steps above
	 * stay in this process (a reader has no stats lines). */
	CHECK(cxlkv_pnm_attend(w, NULL, q, QH, 0, &st, out_sel, lse_sel, NULL) == 0);
	{
		static char text[1 << 16];
		int n = cxlkv_stats_prometheus(pool, text, sizeof text);

		CHECK(n > 0 && n < (int)sizeof text);
		CHECK(strstr(text, "# TYPE cxlkv_pnm_select_seconds histogram\n") != NULL);
		CHECK(strstr(text, "\ncxlkv_pnm_digest_builds_total{partition=\"0\"} 1\n") != NULL);
		CHECK(strstr(text, "\ncxlkv_pnm_appended_tokens_total{partition=\"0\"} 100\n") != NULL);
		CHECK(strstr(text, "\ncxlkv_pnm_select_steps_total{partition=\"0\"} 1\n") != NULL);
		CHECK(strstr(text, "\ncxlkv_pnm_attention_steps_total{partition=\"0\"} 1\n") != NULL);
		CHECK(strstr(text, "cxlkv_pnm_digest_builds_total{partition=\"1\"}") == NULL);
	}

	/* Bad input. */
	CHECK_ERR(cxlkv_pnm_attend(r, NULL, q, 3, 0, &st, out_sel, lse_sel, NULL), -EINVAL);
	CHECK_ERR(cxlkv_pnm_attend(r, NULL, NULL, QH, 0, &st, out_sel, lse_sel, NULL), -EINVAL);
	st.score_mode = 9;
	CHECK_ERR(cxlkv_pnm_attend(r, NULL, q, QH, 0, &st, out_sel, lse_sel, NULL), -EINVAL);
	g.dtype = 7;
	CHECK_ERR(cxlkv_pnm_create(ws, 5, &g, NULL), -EINVAL);
	CHECK_ERR(cxlkv_pnm_engine_create(0, -1, &eng), -EINVAL);
	/* A NUMA node the host lacks: refused, not an engine left unbound. */
	CHECK_ERR(cxlkv_pnm_engine_create(1, 99, &eng), -EINVAL);
	CHECK(strstr(cxlkv_last_error(), "NUMA node 99 does not exist on this host") != NULL);
	CHECK_ERR(cxlkv_pnm_engine_create(1, -2, &eng), -EINVAL);

	/* group_pages 0 is the store's choice: two levels of 16 from 4096 pages
	 * of capacity; a caller whose struct ends before the digest kind gets
	 * one level, as before the kinds existed. */
	{
		struct cxlkv_pnm_context *big = NULL;
		struct cxlkv_pnm_geometry bg, bgot;

		memset(&bg, 0, sizeof bg);
		bg.size = sizeof bg;
		bg.layers = 1;
		bg.kv_heads = 1;
		bg.head_dim = 8;
		bg.dtype = CXLKV_PNM_DTYPE_F32;
		bg.page_tokens = 4;
		bg.max_tokens = 4096 * 4;
		CHECK(cxlkv_pnm_create(ws, 81, &bg, &big) == 0);
		memset(&bgot, 0, sizeof bgot);
		bgot.size = sizeof bgot;
		CHECK(big && cxlkv_pnm_geometry_of(big, &bgot) == 0 && bgot.group_pages == 16);
		cxlkv_pnm_context_close(big);
		CHECK(cxlkv_pnm_destroy(ws, 81) == 0);
		bg.size = offsetof(struct cxlkv_pnm_geometry, digest);
		big = NULL;
		CHECK(cxlkv_pnm_create(ws, 82, &bg, &big) == 0);
		CHECK(big && cxlkv_pnm_geometry_of(big, &bgot) == 0 && bgot.group_pages == 1);
		cxlkv_pnm_context_close(big);
		CHECK(cxlkv_pnm_destroy(ws, 82) == 0);
	}

	/* Destroy: the reader's handle goes stale. */
	CHECK(cxlkv_pnm_destroy(ws, 77) == 0);
	CHECK(cxlkv_pnm_refresh(r) == -ESTALE);
	CHECK_ERR(cxlkv_pnm_destroy(ws, 77), -ENOENT);

	cxlkv_pnm_context_close(r);
	cxlkv_pnm_context_close(w);
	cxlkv_pnm_engine_destroy(eng);
	cxlkv_pnm_store_close(rs);
	cxlkv_pnm_store_close(ws);
	cxlkv_pool_close(pool);
	snprintf(shmname, sizeof shmname, "/cxlkv-pnm-capi-%d", (int)getpid());
	shm_unlink(shmname);
	return failures ? 1 : 0;
}
