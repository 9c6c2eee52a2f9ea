# Man pages, generated at build time from one source each:
#  - cxlkvctl(8), cxlkvd(8), cxlkv-replay(1): help2man from the tool's own
#    --help and --version (so options and commands cannot drift from the
#    program) plus TOOL.h2m (description, environment, files, examples, see
#    also); cxlkvctl(8) also gets a COMMANDS section generated from
#    `cxlkvctl CMD --help` of every command (gen-cxlkvctl-commands.sh).
#  - cxlkv(7), the overview with no program behind it: cxlkv.7.md converted
#    by go-md2man.
# Both converters are Debian packages (tools/scripts/deps.sh).
find_program(CXLKV_HELP2MAN help2man)
find_program(CXLKV_GO_MD2MAN go-md2man)
if(NOT CXLKV_HELP2MAN OR NOT CXLKV_GO_MD2MAN)
  message(STATUS "cxlkv: help2man or go-md2man not found -- man pages are not built (make deps installs them)")
  return()
endif()

set(MANSRC ${CMAKE_CURRENT_SOURCE_DIR}/man)
set(MANOUT ${CMAKE_CURRENT_BINARY_DIR}/man)
file(MAKE_DIRECTORY ${MANOUT})
# help2man TOOL SECTION "one-line description" [extra include]
# help2man runs MANOUT/bin/TOOL: the tool with its "usage:" line spelt
# "Usage:", the form help2man turns into the SYNOPSIS section.
function(cxlkv_help2man tool section name)
  set(out ${MANOUT}/${tool}.${section})
  file(MAKE_DIRECTORY ${MANOUT}/bin)
  file(GENERATE OUTPUT ${MANOUT}/bin/${tool}
       CONTENT "#!/bin/sh\n\"$<TARGET_FILE:${tool}>\" \"$@\" | sed 's/^usage: /Usage: /'\n"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(includes)
  set(deps ${tool})
  if(EXISTS ${MANSRC}/${tool}.h2m)
    set(includes --include ${MANSRC}/${tool}.h2m)
    list(APPEND deps ${MANSRC}/${tool}.h2m)
  endif()
  if(ARGN)
    list(APPEND includes --include ${ARGN})
    list(APPEND deps ${ARGN})
  endif()
  add_custom_command(OUTPUT ${out}
    COMMAND ${CXLKV_HELP2MAN} --no-info --no-discard-stderr --section ${section} --name ${name}
            --source "cxlkv ${PROJECT_VERSION}" --manual "cxlkv manual"
            ${includes} --output ${out} ${MANOUT}/bin/${tool}
    DEPENDS ${deps}
    COMMENT "help2man ${tool}.${section}" VERBATIM)
  set(CXLKV_MAN_PAGES ${CXLKV_MAN_PAGES} ${out} PARENT_SCOPE)
  install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
endfunction()

add_custom_command(OUTPUT ${MANOUT}/cxlkvctl-commands.h2m
  COMMAND sh ${MANSRC}/gen-cxlkvctl-commands.sh $<TARGET_FILE:cxlkvctl> ${MANOUT}/cxlkvctl-commands.h2m
  DEPENDS cxlkvctl ${MANSRC}/gen-cxlkvctl-commands.sh
  COMMENT "cxlkvctl(8): COMMANDS from every command's --help" VERBATIM)
cxlkv_help2man(cxlkvctl 8 "operator and debug tool for cxlkv pools" ${MANOUT}/cxlkvctl-commands.h2m)
cxlkv_help2man(cxlkvd 8 "lock manager of a cxlkv pool")
cxlkv_help2man(cxlkv-replay 1 "replay an LLM serving workload through a cxlkv pool")
foreach(tool ${CXLKV_EXTRA_TOOLS})
  if(TARGET ${tool})
    cxlkv_help2man(${tool} 1 "${tool} tool of cxlkv")
  endif()
endforeach()

add_custom_command(OUTPUT ${MANOUT}/cxlkv.7
  COMMAND sh -c "sed 's/@VERSION@/${PROJECT_VERSION}/' ${MANSRC}/cxlkv.7.md | ${CXLKV_GO_MD2MAN} > ${MANOUT}/cxlkv.7"
  DEPENDS ${MANSRC}/cxlkv.7.md
  COMMENT "go-md2man cxlkv.7" VERBATIM)
list(APPEND CXLKV_MAN_PAGES ${MANOUT}/cxlkv.7)
install(FILES ${MANOUT}/cxlkv.7 DESTINATION ${CMAKE_INSTALL_MANDIR}/man7)

add_custom_target(cxlkv-man ALL DEPENDS ${CXLKV_MAN_PAGES})
