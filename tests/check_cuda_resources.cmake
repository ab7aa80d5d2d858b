# tests/check_cuda_resources.cmake — a static check of the CUDA kernels that needs no GPU (ctest label cpu).
#
# Compiles each source with `nvcc -c -arch=<ARCH> --resource-usage` and fails when ptxas reports a non-zero
# "bytes stack frame", "bytes spill stores" or "bytes spill loads" for any of mixtape's functions (kernels and any
# device function ptxas did not inline, in namespace mixtape; CUB's block-level code is inlined into them, and
# Thrust's and CUB's own kernels are theirs). A spill or a
# stack frame in an elementwise or reduction kernel is a silent slowdown (local memory traffic in the
# innermost loop) that only a profiler would show; this makes it a test failure on any machine with nvcc.
#
#   cmake -DNVCC=/usr/local/cuda/bin/nvcc -DSOURCE=cuda/elementwise.cu,cuda/reduce.cu
#         -DINCLUDES=<build>/include [-DARCH=sm_90] [-DWORK_DIR=<dir>] -P tests/check_cuda_resources.cmake
#
# SOURCE and INCLUDES take several entries separated by commas (or semicolons, when not passed through ctest).
cmake_minimum_required(VERSION 3.25)

foreach(_var NVCC SOURCE INCLUDES)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "check_cuda_resources: -D${_var}=... is required")
  endif()
endforeach()
if(NOT DEFINED ARCH)
  set(ARCH sm_90)
endif()
if(NOT DEFINED WORK_DIR)
  set(WORK_DIR "${CMAKE_CURRENT_BINARY_DIR}/check_cuda_resources")
endif()
file(MAKE_DIRECTORY "${WORK_DIR}")

string(REPLACE "," ";" _sources "${SOURCE}")
string(REPLACE "," ";" _includes "${INCLUDES}")
include(${CMAKE_CURRENT_LIST_DIR}/ptxas_report.cmake)

set(_include_flags)
foreach(_dir IN LISTS _includes)
  list(APPEND _include_flags "-I${_dir}")
endforeach()

set(_failures "")
foreach(_src IN LISTS _sources)
  get_filename_component(_name "${_src}" NAME_WE)
  # The flags of the library build that change code generation (CMakeLists.txt): C++20, relaxed constexpr, -O3.
  execute_process(
    COMMAND "${NVCC}" -c -arch=${ARCH} --resource-usage -std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG
            -DMIXTAPE_WITH_CUDA=1 ${_include_flags} -x cu "${_src}" -o "${WORK_DIR}/${_name}.o"
    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "check_cuda_resources: nvcc failed on ${_src} (exit ${_rc}):\n${_out}${_err}")
  endif()
  mixtape_ptxas_spills("${_out}\n${_err}" "^_ZN7mixtape" "${_name}.cu" _checked _failures)
  if(_checked EQUAL 0)
    message(FATAL_ERROR "check_cuda_resources: no mixtape kernel found in the ptxas report of ${_src} "
                        "(did the report format change?):\n${_err}")
  endif()
  message(STATUS "check_cuda_resources: ${_name}.cu: ${_checked} kernels checked for ${ARCH}")
endforeach()

if(NOT _failures STREQUAL "")
  message(FATAL_ERROR "check_cuda_resources: kernels with a stack frame or register spills (${ARCH}):${_failures}")
endif()
