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
#            ferry_file_hash's workers, the memstat sampler. scripts/test.sh
#            runs these (ctest -L threads) under ThreadSanitizer, not the
#            whole suite: TSan is slow, and single-threaded cases have nothing
#            to show it.
#   gpu      needs a real GPU (skipped, exit 77, without a CUDA driver)
#
# tests/CMakeLists.txt and each folder that registers tests call
# ferry_label_tests() after their add_test lines; a name below that is not a
# registered test fails the configure step (in the plain build, which
# registers every test), so a renamed case cannot silently lose its label.

set(FERRY_SLOW_TESTS
  comfyui_pack comfyui_stock python_binding readme simulate_seed stream_diffusers
  test_stream.engine_soak test_soak.long gpu_async_cuda)

set(FERRY_THREADS_TESTS
  test_xfer_paths.paths test_xfer_into.load_into test_xfer_register.register_pieces test_xfer_ring.tmpfs_ring
  test_xfer_ring.ring_reuse test_xfer_route.pageable test_xfer_route.prepare test_xfer_ring.own_fds test_xfer_ring.progress
  test_xfer_ring.concurrent test_xfer_faults.faults test_xfer_faults.regressions test_xfer_moves.moves test_xfer_route.route_choice
  test_xfer_route.reader_pool
  test_store_tiers.tiers test_store_spill.spill test_store_tiers.device_faults test_store_tiers.jobs test_store_spill.kill9
  test_store_threads.threads test_store_threads.find_remove test_store_tiers.review test_store_threads.async test_store_pinned.pinned_cache
  test_stream.cyclic test_stream.threads test_stream.faults test_stream.budget test_stream.lane_fault
  test_stream.stream_wait_while_landing test_stream.async_file_reads test_stream.async_file_read_fails
  test_stream.engine_cyclic test_stream.engine_squeeze
  test_file.hash test_file.allocator test_gpu.threads
  test_memstat.sampler_fake test_memstat.sampler_real test_memstat.v1_sampler
  test_soak.short load_sim_views test_store_threads.evict_unlocked test_resources.pinpool
  test_resources.fences test_resources.keeper
  test_keepstore.served test_keepstore.changed test_keepstore.dirty test_keepstore.pinned_cache
  test_keepfail.killed test_keepfail.hung test_keepfail.faults)

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
    if(t IN_LIST FERRY_THREADS_TESTS)
      list(APPEND labels threads)
    endif()
    if(t IN_LIST FERRY_GPU_TESTS)
      list(APPEND labels gpu)
    endif()
    set_property(TEST ${t} APPEND PROPERTY LABELS ${labels})
    set_property(GLOBAL APPEND PROPERTY FERRY_LABELLED_TESTS ${t})
  endforeach()
endfunction()

# Every name the lists above give must be a test that was labelled. The
# threads list always (scripts/test.sh's TSan stage selects by it); the others
# in the plain build, where every test is registered.
function(ferry_check_labels)
  get_property(seen GLOBAL PROPERTY FERRY_LABELLED_TESTS)
  set(lists FERRY_THREADS_TESTS)
  if(NOT FERRY_SANITIZE AND NOT FERRY_TSAN AND NOT FERRY_FUZZ)
    list(APPEND lists FERRY_SLOW_TESTS FERRY_GPU_TESTS)
  endif()
  foreach(l ${lists})
    foreach(t ${${l}})
      if(NOT t IN_LIST seen)
        message(FATAL_ERROR "tests/labels.cmake: ${l} names '${t}', which is not a registered test")
      endif()
    endforeach()
  endforeach()
endfunction()
