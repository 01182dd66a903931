# SPDX-License-Identifier: Apache-2.0
# check_cases.cmake - does `BIN --list` print exactly CASES (the names
# tests/unit/CMakeLists.txt read from the source), in that order?
execute_process(COMMAND ${BIN} --list OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BIN} --list exited with ${rc}")
endif()
string(STRIP "${out}" out)
string(REPLACE "\n" ";" listed "${out}")
if(NOT listed STREQUAL CASES)
  message(FATAL_ERROR "${BIN} --list prints [${listed}], the CMake pattern found [${CASES}]: "
    "write each case as one line `CASE(name, call)` in the CASES list")
endif()
