# SPDX-License-Identifier: Apache-2.0
# labels.cmake - the ctest labels of every test. Each test has one tier label,
# quick or slow, and where it applies threads and gpu:
#
#   quick    the fast tier: everything not listed slow below; all of it runs
#            in under two minutes with ctest -j2 on 2 CPUs (ctest -L quick)
#   slow     ComfyUI, diffusers and the binding under every interpreter, the
#            README's commands, the seed scenario, the soaks (ctest -L slow)
#   threads  the cases whose code runs on several threads: the ring readers and
#            sim streams of xfer, the store under concurrent callers,
#            ferry_file_hash's workers, the memstat sampler. Set where a test
#            is declared: a unit test's THREADS cases (ferry_unit_test in
#            tests/unit/CMakeLists.txt), set_property(TEST ... LABELS threads)
#            for any other. scripts/test.sh runs these (ctest -L threads) under
#            ThreadSanitizer, not the whole suite: TSan is slow, and
#            single-threaded cases have nothing to show it.
#   gpu      needs a real GPU (skipped, exit 77, without a CUDA driver)
#
# tests/CMakeLists.txt and each folder that registers tests call
# ferry_label_tests() after their add_test lines; a name below that is not a
# registered test fails the configure step (in the plain build, which
# registers every test), so a renamed case cannot silently lose its label.

set(FERRY_SLOW_TESTS
  comfyui_pack comfyui_stock python_binding readme simulate_seed stream_diffusers
  test_stream.engine_soak test_soak.long gpu_async_cuda)

set(FERRY_GPU_TESTS gpu_async_cuda)

# Labels every test registered in the calling directory so far.
function(ferry_label_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    if(t IN_LIST FERRY_SLOW_TESTS)
      set(labels slow)
    else()
      set(labels quick)
    endif()
    if(t IN_LIST FERRY_GPU_TESTS)
      list(APPEND labels gpu)
    endif()
    set_property(TEST ${t} APPEND PROPERTY LABELS ${labels})
    set_property(GLOBAL APPEND PROPERTY FERRY_LABELLED_TESTS ${t})
  endforeach()
endfunction()

# Every name the lists above give must be a test that was labelled, checked
# in the plain build, where every test is registered.
function(ferry_check_labels)
  get_property(seen GLOBAL PROPERTY FERRY_LABELLED_TESTS)
  set(lists "")
  if(NOT FERRY_SANITIZE AND NOT FERRY_TSAN AND NOT FERRY_FUZZ)
    set(lists FERRY_SLOW_TESTS FERRY_GPU_TESTS)
  endif()
  foreach(l ${lists})
    foreach(t ${${l}})
      if(NOT t IN_LIST seen)
        message(FATAL_ERROR "tests/labels.cmake: ${l} names '${t}', which is not a registered test")
      endif()
    endforeach()
  endforeach()
endfunction()
