# SPDX-License-Identifier: Apache-2.0
# check_layers.cmake - run by the build (cmake -P): every #include "..." in
# src/ names a header of the file's own folder, or "layer/header.h" of a layer
# it may use (layer_rules.cmake). Fails the build naming the file, the include
# and the rule it breaks.
cmake_minimum_required(VERSION 3.18) # script mode: IN_LIST and friends
include(${CMAKE_CURRENT_LIST_DIR}/layer_rules.cmake)
set(bad "")
foreach(layer ${FERRY_LAYERS})
  set(allowed ${FERRY_SEES_${layer}})
  file(GLOB files ${SRC}/${layer}/*.c ${SRC}/${layer}/*.h)
  foreach(f ${files})
    file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(l ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" inc "${l}")
      file(RELATIVE_PATH rel ${SRC} ${f})
      if(inc MATCHES "\\.\\.")
        list(APPEND bad "src/${rel}: #include \"${inc}\": no \"../\" paths (name another layer's header as layer/header.h)")
      elseif(inc MATCHES "/")
        string(REGEX REPLACE "/.*" "" dir "${inc}")
        if(NOT (dir STREQUAL layer OR dir IN_LIST allowed OR inc IN_LIST allowed))
          list(APPEND bad "src/${rel}: #include \"${inc}\": ${layer}/ may use only: ${allowed}")
        endif()
      elseif(NOT EXISTS ${SRC}/${layer}/${inc} AND NOT inc STREQUAL "ferry.h" AND NOT inc STREQUAL "ferry_version.h"
             AND NOT inc STREQUAL "ferry_experimental.h")
        list(APPEND bad "src/${rel}: #include \"${inc}\": not a header of ${layer}/")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  list(JOIN bad "\n  " msg)
  message(FATAL_ERROR "layering violations:\n  ${msg}")
endif()
