# libFuzzer targets of the daemon (request, response and stream pipelines; the Responses
# translator). libFuzzer needs clang (Debian 12: packages clang and libclang-rt-14-dev); the
# project may be built with GCC, so the daemon sources the fuzzers share are compiled once by
# clang into one archive (servedeck_fuzz_archive), which every target links (servedeck_add_fuzzer).
# Each target runs under ctest for FUZZ_SECONDS from the seed corpus checked in beside it, with
# ASan + UBSan and a per-input timeout that makes a slow input (a hang, a quadratic path) a
# finding. Nothing is built when clang++ cannot link a fuzzer.

find_program(SERVEDECK_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
set(SERVEDECK_DAEMON_FUZZ OFF)
if(SERVEDECK_CLANGXX)
  set(_probe_dir ${CMAKE_CURRENT_BINARY_DIR}/daemon_fuzz_probe)
  file(MAKE_DIRECTORY ${_probe_dir})
  file(WRITE ${_probe_dir}/probe.cpp
    "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
  execute_process(COMMAND ${SERVEDECK_CLANGXX} -fsanitize=fuzzer ${_probe_dir}/probe.cpp -o ${_probe_dir}/probe
                  RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(_probe_rc EQUAL 0)
    set(SERVEDECK_DAEMON_FUZZ ON)
  endif()
endif()
if(NOT SERVEDECK_DAEMON_FUZZ)
  message(STATUS "servedeck: clang++ -fsanitize=fuzzer unavailable; the daemon's fuzz targets are not built")
endif()

# Seconds each daemon fuzz target runs under ctest.
set(SERVEDECK_FUZZ_SECONDS 15)
set(SERVEDECK_FUZZ_FLAGS -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
    -fno-sanitize-recover=undefined -Wall -Wextra -Wno-missing-field-initializers -Werror -I${PROJECT_SOURCE_DIR})
set(SERVEDECK_FUZZ_DIR ${PROJECT_BINARY_DIR}/tests/daemon_fuzz)

# servedeck_fuzz_archive(NAME SOURCES src...): compiles the sources (paths relative to the
# project root) with clang, coverage-instrumented, into ${SERVEDECK_FUZZ_DIR}/lib<NAME>.a and
# sets SERVEDECK_FUZZ_ARCHIVE_<NAME> to its path.
function(servedeck_fuzz_archive name)
  cmake_parse_arguments(A "" "" "SOURCES" ${ARGN})
  set(objs)
  foreach(src ${A_SOURCES})
    string(MAKE_C_IDENTIFIER ${src} id)
    set(obj ${SERVEDECK_FUZZ_DIR}/obj/${id}.o)
    add_custom_command(OUTPUT ${obj}
      COMMAND ${CMAKE_CXX_COMPILER_LAUNCHER} ${SERVEDECK_CLANGXX} ${SERVEDECK_FUZZ_FLAGS} -fsanitize=fuzzer-no-link
              -MD -MF ${obj}.d -c ${PROJECT_SOURCE_DIR}/${src} -o ${obj}
      DEPENDS ${PROJECT_SOURCE_DIR}/${src}
      DEPFILE ${obj}.d
      COMMENT "clang (fuzz): ${src}"
      VERBATIM)
    list(APPEND objs ${obj})
  endforeach()
  set(lib ${SERVEDECK_FUZZ_DIR}/lib${name}.a)
  add_custom_command(OUTPUT ${lib}
    COMMAND ${CMAKE_COMMAND} -E rm -f ${lib}
    COMMAND ${CMAKE_AR} qc ${lib} ${objs}
    COMMAND ${CMAKE_RANLIB} ${lib}
    DEPENDS ${objs}
    COMMENT "Archiving the ${name} fuzz objects"
    VERBATIM)
  add_custom_target(${name}_fuzz_archive DEPENDS ${lib})
  set(SERVEDECK_FUZZ_ARCHIVE_${name} ${lib} PARENT_SCOPE)
endfunction()

# servedeck_add_fuzzer(NAME SOURCE file.cpp ARCHIVES name... CORPUS dir [DICT file] [MAX_LEN n]):
# links the target (run by ctest as NAME for SERVEDECK_FUZZ_SECONDS; new inputs go to the build
# tree's corpus, the checked-in CORPUS seeds it; a finding is written to the build tree as
# NAME-crash-*, NAME-timeout-* or NAME-slow-*).
function(servedeck_add_fuzzer name)
  cmake_parse_arguments(F "" "SOURCE;CORPUS;DICT;MAX_LEN" "ARCHIVES" ${ARGN})
  if(NOT F_MAX_LEN)
    set(F_MAX_LEN 8192)
  endif()
  set(libs)
  set(deps)
  foreach(a ${F_ARCHIVES})
    list(APPEND libs ${SERVEDECK_FUZZ_ARCHIVE_${a}})
    list(APPEND deps ${a}_fuzz_archive ${SERVEDECK_FUZZ_ARCHIVE_${a}})
  endforeach()
  set(bin ${CMAKE_CURRENT_BINARY_DIR}/${name})
  set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}.o)
  add_custom_command(OUTPUT ${obj}
    COMMAND ${CMAKE_CXX_COMPILER_LAUNCHER} ${SERVEDECK_CLANGXX} ${SERVEDECK_FUZZ_FLAGS} -fsanitize=fuzzer-no-link
            -DSERVEDECK_SOURCE_DIR="${PROJECT_SOURCE_DIR}" -MD -MF ${obj}.d -c ${F_SOURCE} -o ${obj}
    DEPENDS ${F_SOURCE}
    DEPFILE ${obj}.d
    COMMENT "clang (fuzz): ${name}"
    VERBATIM)
  add_custom_command(OUTPUT ${bin}
    COMMAND ${SERVEDECK_CLANGXX} ${SERVEDECK_FUZZ_FLAGS} -fsanitize=fuzzer ${obj} ${libs} -o ${bin}
    DEPENDS ${obj} ${deps}
    COMMENT "Linking the ${name} libFuzzer target with clang"
    VERBATIM)
  add_custom_target(${name}_build ALL DEPENDS ${bin})
  set(dict)
  if(F_DICT)
    set(dict "-dict=${F_DICT}")
  endif()
  add_test(NAME ${name}
    COMMAND sh -c "mkdir -p ${name}_corpus && exec '${bin}' -max_total_time=${SERVEDECK_FUZZ_SECONDS} -timeout=5 -rss_limit_mb=2048 -max_len=${F_MAX_LEN} ${dict} -print_final_stats=1 -artifact_prefix=${name}- ${name}_corpus '${F_CORPUS}'"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES TIMEOUT 120 LABELS fuzz)
endfunction()
