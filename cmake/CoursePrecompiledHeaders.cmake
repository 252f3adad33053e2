# The third-party headers that most files parse (CLI11, about 7 s a file; nlohmann-json, 3 s; GoogleTest,
# 2 s) are compiled once for each kind of target instead: a precompiled header that the library builds
# for itself, and one that every program (chapters, benchmarks) and one that every test executable
# shares (CMake's REUSE_FROM: the same compiler flags, which GCC requires of a precompiled header).
# COURSE_PRECOMPILED_HEADERS=OFF parses them in every file, as without.
option(COURSE_PRECOMPILED_HEADERS "Compile CLI11, nlohmann-json and GoogleTest once per kind of target" ON)

set(_course_pch_headers <CLI/CLI.hpp> <nlohmann/json.hpp>)

# For course_common itself (its CUDA files parse none of them).
function(course_library_precompiled_headers target)
  if(COURSE_PRECOMPILED_HEADERS)
    # (">" ends a generator expression: the headers' closing brackets are written $<ANGLE-R>.)
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<CLI/CLI.hpp$<ANGLE-R>>"
                                                "$<$<COMPILE_LANGUAGE:CXX>:<nlohmann/json.hpp$<ANGLE-R>>")
  endif()
endfunction()

# course_use_precompiled_headers(TARGET program|test): TARGET shares its kind's precompiled header.
# The kind's own target compiles it with the flags its targets have: those of course_common's users,
# and for the tests also GoogleTest and their -O1 (tests/CMakeLists.txt).
function(course_use_precompiled_headers target kind)
  if(NOT COURSE_PRECOMPILED_HEADERS)
    return()
  endif()
  set(pch course_pch_${kind})
  if(NOT TARGET ${pch})
    set(source ${CMAKE_BINARY_DIR}/${pch}.cpp)
    if(NOT EXISTS ${source})
      file(WRITE ${source} "// The target that compiles the ${kind}s' precompiled header.\n")
    endif()
    add_library(${pch} OBJECT ${source})
    target_link_libraries(${pch} PRIVATE course_common)
    if(kind STREQUAL "test")
      target_link_libraries(${pch} PRIVATE GTest::gtest)
      target_compile_options(${pch} PRIVATE $<$<CONFIG:Release>:-O1>)
      target_precompile_headers(${pch} PRIVATE ${_course_pch_headers} <gtest/gtest.h>)
    else()
      target_precompile_headers(${pch} PRIVATE ${_course_pch_headers})
    endif()
  endif()
  target_precompile_headers(${target} REUSE_FROM ${pch})
endfunction()
