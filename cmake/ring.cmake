# cmake/ring.cmake — ring attention (src/ring): the API in every build; MPI for host tensors when MPI is
# found, NCCL for device tensors when CUDA and NCCL are; its MPI tests (tests/ring) as ctests run by mpiexec.
#
# Included by CMakeLists.txt after the tests block (it needs the flashc and flashc_objects targets, flashc_link and
# enable_testing):
#   include(cmake/ring.cmake)
# Options: FLASHC_MPI (AUTO/ON/OFF, declared in CMakeLists.txt) for MPI; FLASHC_NCCL (AUTO/ON/OFF) below.

set(FLASHC_NCCL AUTO CACHE STRING "Ring attention over NCCL for device tensors: AUTO (with CUDA, when nccl.h is found), ON or OFF")
set_property(CACHE FLASHC_NCCL PROPERTY STRINGS AUTO ON OFF)

# ---- the comm-agnostic part: the public ring API, the algorithm, sharding, host buffers --------------
target_sources(flashc_objects PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src/ring/create.c ${CMAKE_CURRENT_LIST_DIR}/../src/ring/ring.c
                              ${CMAKE_CURRENT_LIST_DIR}/../src/ring/shard.c ${CMAKE_CURRENT_LIST_DIR}/../src/ring/mem_host.c
                              ${CMAKE_CURRENT_LIST_DIR}/../src/ring/threads.c)

# ---- MPI --------------------------------------------------------------------------------------------------
set(FLASHC_HAVE_MPI OFF)
if(NOT FLASHC_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(FLASHC_HAVE_MPI ON)
    # MPI's headers and flags reach comm_mpi.c alone, and FLASHC_RING_MPI the C files alone: turning MPI on or
    # off must not change the CUDA files' command lines, or every kernel would compile again.
    set(flashc_comm_mpi ${CMAKE_CURRENT_LIST_DIR}/../src/ring/comm_mpi.c)
    target_sources(flashc_objects PRIVATE ${flashc_comm_mpi})
    set_source_files_properties(${flashc_comm_mpi} PROPERTIES INCLUDE_DIRECTORIES "${MPI_C_INCLUDE_DIRS}"
                                COMPILE_OPTIONS "${MPI_C_COMPILE_OPTIONS}" COMPILE_DEFINITIONS "${MPI_C_COMPILE_DEFINITIONS}")
    flashc_link(PRIVATE $<LINK_ONLY:MPI::MPI_C>)
    target_compile_definitions(flashc_objects PRIVATE $<$<COMPILE_LANGUAGE:C>:FLASHC_RING_MPI=1>)
  elseif(FLASHC_MPI STREQUAL "ON")
    message(FATAL_ERROR "FLASHC_MPI=ON but no MPI was found (apt-get install openmpi-bin libopenmpi-dev)")
  endif()
endif()
message(STATUS "flashc: ring attention over MPI ${FLASHC_HAVE_MPI}")

# ---- NCCL (the header from the CUDA toolkit's directories, or the system's) -------------------------------------
# libflashc does not link NCCL: comm_nccl.c loads it when the first NCCL ring is created, and uses the one the
# process has already loaded when there is one (PyTorch's), so that importing flashc never brings a second
# NCCL ahead of torch's. Building needs only nccl.h; the library found here is the fallback path to load
# and what the NCCL test links (it creates its communicators itself).
set(FLASHC_HAVE_NCCL OFF)
if(FLASHC_HAVE_CUDA AND NOT FLASHC_NCCL STREQUAL "OFF")
  find_path(FLASHC_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include /usr/local/cuda/include /usr/include)
  find_library(FLASHC_NCCL_LIBRARY NAMES nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64
                     /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
  if(FLASHC_NCCL_INCLUDE_DIR)
    set(FLASHC_HAVE_NCCL ON)
    set(flashc_comm_nccl ${CMAKE_CURRENT_LIST_DIR}/../src/ring/comm_nccl.c)
    target_sources(flashc_objects PRIVATE ${flashc_comm_nccl} ${CMAKE_CURRENT_LIST_DIR}/../src/ring/mem_device.cu)
    # -isystem: NCCL's header is not held to the project's warnings. Only comm_nccl.c includes it.
    set_source_files_properties(${flashc_comm_nccl} PROPERTIES COMPILE_OPTIONS "-isystem;${FLASHC_NCCL_INCLUDE_DIR}")
    if(FLASHC_NCCL_LIBRARY)
      get_filename_component(flashc_nccl_dir ${FLASHC_NCCL_LIBRARY} DIRECTORY)
      set_property(SOURCE ${flashc_comm_nccl} APPEND PROPERTY COMPILE_DEFINITIONS
                                                               FLASHC_NCCL_PATH="${flashc_nccl_dir}/libnccl.so.2")
      add_library(flashc_nccl UNKNOWN IMPORTED) # for the test only; imported: its headers are system headers
      set_target_properties(flashc_nccl PROPERTIES IMPORTED_LOCATION ${FLASHC_NCCL_LIBRARY}
                                                   INTERFACE_INCLUDE_DIRECTORIES ${FLASHC_NCCL_INCLUDE_DIR})
    endif()
    flashc_link(PRIVATE ${CMAKE_DL_LIBS})
    target_compile_definitions(flashc_objects PRIVATE $<$<COMPILE_LANGUAGE:C>:FLASHC_RING_NCCL=1>)
  elseif(FLASHC_NCCL STREQUAL "ON")
    message(FATAL_ERROR "FLASHC_NCCL=ON but nccl.h was not found next to the CUDA toolkit")
  endif()
elseif(FLASHC_NCCL STREQUAL "ON")
  message(FATAL_ERROR "FLASHC_NCCL=ON needs the CUDA backends (FLASHC_CUDA)")
endif()
if(FLASHC_HAVE_NCCL)
  message(STATUS "flashc: ring attention over NCCL ON (libnccl.so.2 loaded at run time; else ${FLASHC_NCCL_LIBRARY})")
else()
  message(STATUS "flashc: ring attention over NCCL OFF")
endif()

# ---- tests ------------------------------------------------------------------------------------------------
set(FLASHC_RING_TEST_DIR ${CMAKE_CURRENT_LIST_DIR}/../tests/ring)
# The ring tests call fc_* internals: they link the library's objects, not libflashc. Their harness compiles
# once for all of them; the archive links nothing itself (each test brings the objects).
function(flashc_ring_test name)
  if(NOT TARGET flashc_ring_harness)
    add_library(flashc_ring_harness STATIC ${FLASHC_RING_TEST_DIR}/harness.c)
    target_include_directories(flashc_ring_harness PRIVATE ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../include
                                                           ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../src)
    target_compile_definitions(flashc_ring_harness PRIVATE _POSIX_C_SOURCE=200809L)
    target_compile_options(flashc_ring_harness PRIVATE ${FLASHC_C_WARNINGS} -O2)
    if(FLASHC_HAVE_CUDA) # shards in GPU memory (the NCCL path)
      target_link_libraries(flashc_ring_harness PUBLIC CUDA::cudart_static)
      target_compile_definitions(flashc_ring_harness PUBLIC FLASHC_TEST_CUDA=1)
    endif()
  endif()
  add_executable(${name} ${FLASHC_RING_TEST_DIR}/${name}.c)
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../src)
  target_compile_definitions(${name} PRIVATE _POSIX_C_SOURCE=200809L)
  target_compile_options(${name} PRIVATE ${FLASHC_C_WARNINGS} -O2)
  target_link_libraries(${name} PRIVATE flashc_ring_harness flashc_objects Threads::Threads m)
endfunction()

# test_threads: a CPU rank's default share of its node's cores (no MPI needed).
if(FLASHC_BUILD_TESTS)
  add_executable(test_threads ${FLASHC_RING_TEST_DIR}/test_threads.c)
  target_include_directories(test_threads PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src)
  target_compile_options(test_threads PRIVATE ${FLASHC_C_WARNINGS} -O2)
  target_link_libraries(test_threads PRIVATE flashc_objects) # it calls fc_ring_split_cores, an internal
  add_test(NAME ring_threads COMMAND test_threads)
endif()

# test_ring: the ranks as MPI processes, on 1..4 ranks (host tensors), and the peer-failure checks.
if(FLASHC_BUILD_TESTS AND FLASHC_HAVE_MPI)
  flashc_ring_test(test_ring)
  target_link_libraries(test_ring PRIVATE MPI::MPI_C)
  # Open MPI refuses root and more ranks than cores unless told, and in containers its shared-memory
  # single-copy (CMA, ptrace) is often forbidden; these variables say so and are ignored by other MPIs.
  # LeakSanitizer is off for these: Open MPI's own allocations at exit would fail every run.
  set(FLASHC_RING_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                           OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
                           OMPI_MCA_btl_vader_single_copy_mechanism=none ASAN_OPTIONS=detect_leaks=0)
  foreach(np 1 2 3 4)
    add_test(NAME ring_np${np} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
                                       $<TARGET_FILE:test_ring> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(ring_np${np} PROPERTIES TIMEOUT 600 ENVIRONMENT "${FLASHC_RING_TEST_ENV}")
  endforeach()
  foreach(mode exit stall)
    add_test(NAME ring_fault_${mode}
             COMMAND ${CMAKE_CURRENT_LIST_DIR}/../scripts/ring-test --fault ${mode} --bin $<TARGET_FILE:test_ring>
                     --mpiexec ${MPIEXEC_EXECUTABLE})
    set_tests_properties(ring_fault_${mode} PROPERTIES TIMEOUT 300 ENVIRONMENT "${FLASHC_RING_TEST_ENV}")
  endforeach()
endif()

# test_ring_nccl: the NCCL path without MPI, one thread per GPU; skipped (exit 77) where there is no GPU.
if(FLASHC_BUILD_TESTS AND TARGET flashc_nccl)
  flashc_ring_test(test_ring_nccl)
  target_link_libraries(test_ring_nccl PRIVATE flashc_nccl)
  add_test(NAME ring_nccl_threads COMMAND test_ring_nccl)
  set_tests_properties(ring_nccl_threads PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# ---- the CLI's `flashc ring` (cli/ring.c) needs MPI in the flashc executable --------------------------------
if(TARGET flashc_cli AND FLASHC_HAVE_MPI)
  target_link_libraries(flashc_cli PRIVATE MPI::MPI_C)
  target_compile_definitions(flashc_cli PRIVATE FLASHC_CLI_MPI=1)
endif()
