# SPDX-License-Identifier: MIT
"""Serving-engine adapters.  Each imports its engine lazily, so it can be
imported (and tested through the engine's call sequence) without the engine."""
