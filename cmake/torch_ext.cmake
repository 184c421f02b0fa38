# cmake/torch_ext.cmake — libflashc_torch.so, the C++ operators behind flashc.torch's eager calls
# (python/flashc/_torch_ext.cpp; python/README.md says why it exists and what it costs).
#
# Included by CMakeLists.txt after the library (it needs the flashc target):
#   include(cmake/torch_ext.cmake)
# FLASHC_TORCH_EXT: AUTO (the default) builds it when `python3 -c "import torch"` works at configure time with a torch
# of 2.10 or later (its stable ABI takes strings from 2.10 on) and a C++ compiler is found; ON requires it; OFF (or 0)
# skips it. The Python interpreter is Python_EXECUTABLE (set by scikit-build-core), else Python3_EXECUTABLE, else python3.
#
# It is written against torch's stable ABI (torch/csrc/stable, TORCH_TARGET_VERSION 2.10) and has no Python ABI, so one
# build serves every torch >= 2.10 and every CPython; it needs torch's headers and libtorch_cpu only to build. It does
# not link libflashc: flashc.torch binds it at load time to the libflashc the package loaded, next to which it lies.

set(FLASHC_TORCH_EXT AUTO CACHE STRING "Build libflashc_torch.so (C++ operators for flashc.torch): AUTO (where torch >= 2.10 imports), ON or OFF")
set_property(CACHE FLASHC_TORCH_EXT PROPERTY STRINGS AUTO ON OFF)

set(FLASHC_HAVE_TORCH_EXT OFF)
set(flashc_torch_why "FLASHC_TORCH_EXT=OFF")
# In the repository the source is python/flashc/; in an sdist (whose C project is csrc/) it is ../flashc/.
set(flashc_torch_src "")
foreach(candidate ${CMAKE_CURRENT_LIST_DIR}/../python/flashc/_torch_ext.cpp ${CMAKE_CURRENT_LIST_DIR}/../../flashc/_torch_ext.cpp)
  if(EXISTS ${candidate})
    set(flashc_torch_src ${candidate})
    break()
  endif()
endforeach()

if(NOT FLASHC_TORCH_EXT STREQUAL "OFF" AND NOT FLASHC_TORCH_EXT STREQUAL "0")
  if(Python_EXECUTABLE)
    set(flashc_python ${Python_EXECUTABLE})
  elseif(Python3_EXECUTABLE)
    set(flashc_python ${Python3_EXECUTABLE})
  else()
    find_program(flashc_python NAMES python3 python)
  endif()
  set(flashc_torch_probe "import os, torch; v = torch.__version__.split('+')[0].split('.'); print(v[0] + ';' + v[1] + ';' + os.path.dirname(torch.__file__))")
  if(NOT flashc_torch_src)
    set(flashc_torch_why "python/flashc/_torch_ext.cpp is not in this source tree")
  elseif(NOT flashc_python)
    set(flashc_torch_why "no python3 found")
  else()
    execute_process(COMMAND ${flashc_python} -c "${flashc_torch_probe}" RESULT_VARIABLE flashc_torch_rc
                    OUTPUT_VARIABLE flashc_torch_out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT flashc_torch_rc EQUAL 0)
      set(flashc_torch_why "`${flashc_python} -c \"import torch\"` failed")
    else()
      list(GET flashc_torch_out 0 flashc_torch_major)
      list(GET flashc_torch_out 1 flashc_torch_minor)
      list(GET flashc_torch_out 2 flashc_torch_dir)
      if(flashc_torch_major LESS 2 OR (flashc_torch_major EQUAL 2 AND flashc_torch_minor LESS 10))
        set(flashc_torch_why "torch ${flashc_torch_major}.${flashc_torch_minor} is older than 2.10 (the stable ABI it needs)")
      else()
        include(CheckLanguage)
        check_language(CXX)
        if(CMAKE_CXX_COMPILER)
          set(FLASHC_HAVE_TORCH_EXT ON)
          set(flashc_torch_why "torch ${flashc_torch_major}.${flashc_torch_minor} at ${flashc_torch_dir}")
        else()
          set(flashc_torch_why "no C++ compiler found")
        endif()
      endif()
    endif()
  endif()
  if(FLASHC_TORCH_EXT STREQUAL "ON" AND NOT FLASHC_HAVE_TORCH_EXT)
    message(FATAL_ERROR "FLASHC_TORCH_EXT=ON but the extension cannot be built: ${flashc_torch_why}")
  endif()
endif()
message(STATUS "flashc: torch extension ${FLASHC_HAVE_TORCH_EXT} (${flashc_torch_why})")

if(FLASHC_HAVE_TORCH_EXT)
  enable_language(CXX)
  find_library(flashc_libtorch_cpu NAMES torch_cpu PATHS ${flashc_torch_dir}/lib NO_DEFAULT_PATH REQUIRED)
  add_library(flashc_torch MODULE ${flashc_torch_src})
  target_include_directories(flashc_torch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../include)
  target_include_directories(flashc_torch SYSTEM PRIVATE ${flashc_torch_dir}/include)
  # libtorch_cpu is named, not found through a path: torch has loaded it when the extension loads. No RPATH into the
  # build machine's torch, no undefined symbol left for the loader to guess.
  target_link_libraries(flashc_torch PRIVATE ${flashc_libtorch_cpu} ${CMAKE_DL_LIBS})
  target_link_options(flashc_torch PRIVATE LINKER:--no-undefined)
  set(flashc_torch_warnings -Wall -Wextra)
  if(FLASHC_WERROR)
    list(APPEND flashc_torch_warnings -Werror)
  endif()
  target_compile_options(flashc_torch PRIVATE ${flashc_torch_warnings} -O2)
  set_target_properties(flashc_torch PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
                        CXX_VISIBILITY_PRESET hidden PREFIX "lib" OUTPUT_NAME flashc_torch SKIP_BUILD_RPATH ON)
  install(TARGETS flashc_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
