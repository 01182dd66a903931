# SPDX-License-Identifier: Apache-2.0
# layers.cmake - each folder of src/ is an object library that sees only the
# headers its layer may use (docs/ARCHITECTURE.md):
#
#   common   nothing (ferry.h only)
#   format   common                 (parsers: bytes -> tensor table, no I/O)
#   io       common                 (system calls, the fault table, memory stats)
#   gpu      common                 (the only place that knows CUDA)
#   file     common io format       (ferry_file: open, map, hash, convert)
#   xfer     common io gpu format file   (the transfer engine)
#   resid    common io and xfer.h alone  (the store: decides, asks xfer to move)
#   keep     common io              (the keeper: daemon, protocol codec, client, backends)
#
# Sources include other layers' headers as "layer/header.h". The compiler finds
# them only through build/layers/<layer>/, which holds links to exactly the
# folders (or, for resid, the one header) that layer may use, so an include of
# anything else does not compile. check_layers.cmake refuses the one way
# around that (a "../" path) and re-states the rules, on every build.

include(${CMAKE_CURRENT_LIST_DIR}/layer_rules.cmake)

set(FERRY_LAYER_ROOT ${PROJECT_BINARY_DIR}/layers)
foreach(layer ${FERRY_LAYERS})
  set(root ${FERRY_LAYER_ROOT}/${layer})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root})
  foreach(seen ${layer} ${FERRY_SEES_${layer}})
    if(seen MATCHES "/")   # one header of a layer
      get_filename_component(dir ${seen} DIRECTORY)
      file(MAKE_DIRECTORY ${root}/${dir})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${seen} ${root}/${seen} SYMBOLIC)
    else()
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${seen} ${root}/${seen} SYMBOLIC)
    endif()
  endforeach()
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${layer}/*.c)
  add_library(ferry_${layer} OBJECT ${srcs})
  target_include_directories(ferry_${layer} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include ${root})
  target_compile_definitions(ferry_${layer} PRIVATE FERRY_BUILDING)
  target_compile_options(ferry_${layer} PRIVATE ${FERRY_WARN} -fvisibility=hidden)
  if(FERRY_FUZZ)
    target_compile_options(ferry_${layer} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
  add_dependencies(ferry_${layer} ferry_layer_check)
  list(APPEND FERRY_LAYER_OBJECTS $<TARGET_OBJECTS:ferry_${layer}>)
endforeach()
# third-party headers, where they are used
add_dependencies(ferry_format jansson)
target_include_directories(ferry_format PRIVATE ${JANSSON_INCLUDE_DIR})
target_include_directories(ferry_file PRIVATE ${XXHASH_INCLUDE_DIR})

# The rules again as a check of every #include line (no "../", no layer a
# layer may not use), run before the layers compile.
add_custom_target(ferry_layer_check
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR}/src -P ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
  COMMENT "checking src/'s layering" VERBATIM)
