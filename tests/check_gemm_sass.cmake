# tests/check_gemm_sass.cmake — the GEMM kernels use the Tensor Cores and keep everything in registers
# (ctest label cpu: needs nvcc, no GPU).
#
# Compiles each GEMM instantiation file (cuda/gemm_f16.cu, gemm_bf16.cu, gemm_tf32.cu) for each
# architecture with `nvcc -c --resource-usage --keep`, then fails when
#   - ptxas reports a non-zero stack frame, spill stores or spill loads for any gemm_kernel, or fewer
#     gemm_kernel entries than expected (12 per file: 4 layouts × the large tile, the small tile, the
#     small tile splitting K over clusters);
#   - with cuobjdump (on PATH or next to nvcc): the SASS of a gemm_kernel has no HMMA instruction, or
#     touches local memory (LDL/STL);
#   - without cuobjdump (this toolkit install lacks it): the PTX of a gemm_kernel has no wmma.mma.sync /
#     mma.sync instruction, and a line says that PTX was checked instead of SASS;
#   - always: the PTX of a gemm_kernel loads a fragment with a generic address (a wmma.load without
#     `.shared`: what nvcc's bf16/tf32 load intrinsics emit, and cuda/gemm_kernel.cuh's load_fragment avoids);
#   - for sm_90 and newer: fewer than 4 gemm_kernels per file (the split-K ones) wait at a cluster barrier and
#     map a cluster block's shared memory (barrier.cluster.wait, mapa): the split would otherwise silently
#     compile to blocks that never see each other's partial sums.
# A silent fall back to CUDA-core FMAs, or a spill in the inner loop, would otherwise only show up as a
# slow benchmark on a GPU.
#
#   cmake -DNVCC=/usr/local/cuda/bin/nvcc -DSOURCE=cuda/gemm_f16.cu,cuda/gemm_bf16.cu,cuda/gemm_tf32.cu
#         -DINCLUDES=<build>/include [-DARCHS=sm_80,sm_90] [-DWORK_DIR=<dir>] [-DCUOBJDUMP=<path>]
#         -P tests/check_gemm_sass.cmake
cmake_minimum_required(VERSION 3.25)

foreach(_var NVCC SOURCE INCLUDES)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "check_gemm_sass: -D${_var}=... is required")
  endif()
endforeach()
if(NOT DEFINED ARCHS)
  set(ARCHS sm_90)
endif()
if(NOT DEFINED WORK_DIR)
  set(WORK_DIR "${CMAKE_CURRENT_BINARY_DIR}/check_gemm_sass")
endif()
set(_expected_kernels 12)
string(ASCII 31 _sep)  # splits listings into sections without CMake list pitfalls

string(REPLACE "," ";" _sources "${SOURCE}")
string(REPLACE "," ";" _includes "${INCLUDES}")
string(REPLACE "," ";" _archs "${ARCHS}")
include(${CMAKE_CURRENT_LIST_DIR}/ptxas_report.cmake)

# The GEMM kernels of a listing: the sections of `text` that start with `marker` (a listing's "Function : " or a PTX
# file's ".entry ") followed by a gemm_kernel's name, in <sections_out>, and those names in <names_out>.
function(mixtape_gemm_sections text marker sections_out names_out)
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "${marker}" "${_sep}${marker}" text "${text}")
  string(REPLACE "${_sep}" ";" text "${text}")
  string(LENGTH "${marker}" _marker_length)
  set(_sections)
  set(_names)
  foreach(_section IN LISTS text)
    string(FIND "${_section}" "${marker}" _at)
    if(NOT _at EQUAL 0)
      continue()
    endif()
    string(SUBSTRING "${_section}" ${_marker_length} -1 _rest)
    if(_rest MATCHES "^([A-Za-z0-9_$.]+)" AND CMAKE_MATCH_1 MATCHES "gemm_kernel")
      list(APPEND _names "${CMAKE_MATCH_1}")
      list(APPEND _sections "${_section}")
    endif()
  endforeach()
  set(${sections_out} "${_sections}" PARENT_SCOPE)
  set(${names_out} "${_names}" PARENT_SCOPE)
endfunction()

set(_include_flags)
foreach(_dir IN LISTS _includes)
  list(APPEND _include_flags "-I${_dir}")
endforeach()

if(NOT DEFINED CUOBJDUMP OR CUOBJDUMP STREQUAL "")
  get_filename_component(_nvcc_dir "${NVCC}" DIRECTORY)
  find_program(CUOBJDUMP cuobjdump HINTS "${_nvcc_dir}" NO_CACHE)
endif()
if(CUOBJDUMP)
  message(STATUS "check_gemm_sass: reading SASS with ${CUOBJDUMP}")
else()
  message(NOTICE "check_gemm_sass: cuobjdump not found: checked PTX wmma instructions instead of SASS HMMA")
endif()

set(_failures "")
foreach(_arch IN LISTS _archs)
  foreach(_src IN LISTS _sources)
    get_filename_component(_name "${_src}" NAME_WE)
    set(_dir "${WORK_DIR}/${_arch}/${_name}")
    file(REMOVE_RECURSE "${_dir}")
    file(MAKE_DIRECTORY "${_dir}")
    # The library's code-generation flags (CMakeLists.txt); --keep leaves the PTX in the keep dir.
    execute_process(
      COMMAND "${NVCC}" -c -arch=${_arch} --resource-usage --keep --keep-dir "${_dir}" -std=c++20
              --expt-relaxed-constexpr -O3 -DNDEBUG -DMIXTAPE_WITH_CUDA=1 ${_include_flags} -x cu "${_src}"
              -o "${_dir}/${_name}.o"
      OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "check_gemm_sass: nvcc failed on ${_src} for ${_arch} (exit ${_rc}):\n${_out}${_err}")
    endif()

    # ---- ptxas: no stack frame and no spills in any gemm_kernel instantiation
    mixtape_ptxas_spills("${_out}\n${_err}" "gemm_kernel" "${_arch} ${_name}" _checked _failures)
    if(NOT _checked EQUAL _expected_kernels)
      string(APPEND _failures "\n  ${_arch} ${_name}: ptxas reported ${_checked} gemm_kernel entries, expected "
                              "${_expected_kernels} (did the report format change?)")
    endif()

    # ---- the instructions: SASS when cuobjdump exists, else the PTX nvcc kept (below).
    set(_entries 0)
    if(CUOBJDUMP)
      execute_process(COMMAND "${CUOBJDUMP}" -sass "${_dir}/${_name}.o"
                      OUTPUT_VARIABLE _sass ERROR_VARIABLE _sass_err RESULT_VARIABLE _rc)
      if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "check_gemm_sass: cuobjdump -sass failed on ${_name}.o (exit ${_rc}):\n${_sass_err}")
      endif()
      mixtape_gemm_sections("${_sass}" "Function : " _sections _names)
      foreach(_section _fn IN ZIP_LISTS _sections _names)
        math(EXPR _entries "${_entries} + 1")
        if(NOT _section MATCHES "HMMA")
          string(APPEND _failures "\n  ${_arch} ${_name}: no HMMA instruction in the SASS of ${_fn}")
        endif()
        if(_section MATCHES "[^A-Z](LDL|STL)[ .]")
          string(APPEND _failures "\n  ${_arch} ${_name}: local memory (LDL/STL) in the SASS of ${_fn}")
        endif()
      endforeach()
      set(_what "SASS HMMA")
    endif()
    # ---- the PTX nvcc kept: shared-space fragment loads always; without cuobjdump the instructions too.
    file(GLOB _ptx_files "${_dir}/*.ptx")
    if(NOT _ptx_files)
      message(FATAL_ERROR "check_gemm_sass: nvcc --keep left no .ptx in ${_dir}")
    endif()
    set(_cluster_kernels 0)
    foreach(_ptx IN LISTS _ptx_files)
      file(READ "${_ptx}" _text)
      mixtape_gemm_sections("${_text}" ".entry " _sections _names)
      foreach(_section _fn IN ZIP_LISTS _sections _names)
        if(_section MATCHES "barrier\\.cluster\\.wait" AND _section MATCHES "mapa\\.")
          math(EXPR _cluster_kernels "${_cluster_kernels} + 1")
        endif()
        if(_section MATCHES "wmma\\.load\\.[ab]\\.sync\\.aligned\\.(row|col)\\.m16n16k[0-9]+\\.[a-z0-9]+[ \t]")
          string(APPEND _failures "\n  ${_arch} ${_name}: a fragment load with a generic address (wmma.load "
                                  "without .shared) in the PTX of ${_fn}")
        endif()
        if(CUOBJDUMP)
          continue()
        endif()
        math(EXPR _entries "${_entries} + 1")
        if(NOT _section MATCHES "(wmma\\.mma\\.sync|[^.]mma\\.sync)")
          string(APPEND _failures "\n  ${_arch} ${_name}: no wmma.mma.sync / mma.sync in the PTX of ${_fn}")
        endif()
        if(NOT _section MATCHES "cp\\.async\\.cg\\.shared\\.global")
          string(APPEND _failures "\n  ${_arch} ${_name}: no 16-byte cp.async in the PTX of ${_fn}")
        endif()
        if(_section MATCHES "\\.local")
          string(APPEND _failures "\n  ${_arch} ${_name}: local memory in the PTX of ${_fn}")
        endif()
      endforeach()
    endforeach()
    if(NOT CUOBJDUMP)
      set(_what "PTX wmma")
    endif()
    string(REGEX MATCH "[0-9]+" _sm "${_arch}")
    if(_sm GREATER_EQUAL 90 AND _cluster_kernels LESS 4)
      string(APPEND _failures "\n  ${_arch} ${_name}: ${_cluster_kernels} gemm_kernels with a cluster barrier and "
                              "distributed shared memory in the PTX, expected the 4 split-K ones")
    endif()
    if(NOT _entries EQUAL _expected_kernels)
      string(APPEND _failures "\n  ${_arch} ${_name}: found ${_entries} gemm_kernel functions in the ${_what} "
                              "listing, expected ${_expected_kernels}")
    endif()
    message(STATUS "check_gemm_sass: ${_arch} ${_name}: ${_checked} kernels without spills, ${_entries} with ${_what}")
  endforeach()
endforeach()

if(NOT CUOBJDUMP)
  message(NOTICE "check_gemm_sass: cuobjdump not found: checked PTX wmma instructions instead of SASS HMMA")
endif()
if(NOT _failures STREQUAL "")
  message(FATAL_ERROR "check_gemm_sass: failed:${_failures}")
endif()
