# tests/install/run.cmake — ctest driver: install the built mixtape into a scratch prefix, check that exactly the
# public headers were installed and that none of them includes an uninstalled one, then configure, build and run
# a consumer project against the prefix: every installed header compiled by g++ and, where nvcc exists, by nvcc.
# The consumer gets mixtape's compiler and sanitizers, as a user of a sanitizer build of mixtape must (its library
# needs the sanitizers' runtimes loaded first, which only an executable linked with -fsanitize does).
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DPUBLIC_HEADERS=a,b,...
#         -DCXX_COMPILER=<c++> [-DSANITIZE=address,undefined] [-DCUDA_COMPILER=<nvcc>] -P run.cmake
file(REMOVE_RECURSE ${WORK_DIR})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)

# Exactly the public headers, and every #include <mixtape/...> of theirs resolves inside the prefix.
set(_include ${WORK_DIR}/prefix/include)
file(GLOB_RECURSE _installed RELATIVE ${_include}/mixtape ${_include}/mixtape/*)
list(SORT _installed)
string(REPLACE "," ";" _expected "${PUBLIC_HEADERS}")
list(SORT _expected)
if(NOT _installed STREQUAL _expected)
  message(FATAL_ERROR "installed headers differ from the public list (CMakeLists.txt's MIXTAPE_PUBLIC_HEADERS):\n"
                      "  installed: ${_installed}\n  expected:  ${_expected}")
endif()
set(_cpp "")
set(_missing "")
foreach(_header IN LISTS _installed)
  string(APPEND _cpp "#include <mixtape/${_header}>\n")
  file(STRINGS ${_include}/mixtape/${_header} _lines REGEX "^#include <mixtape/")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE "^#include <(mixtape/[^>]+)>.*" "\\1" _included "${_line}")
    if(NOT EXISTS ${_include}/${_included})
      string(APPEND _missing "\n  ${_header} includes ${_included}, which is not installed")
    endif()
  endforeach()
endforeach()
if(NOT _missing STREQUAL "")
  message(FATAL_ERROR "installed headers include uninstalled ones:${_missing}")
endif()
list(LENGTH _installed _count)
message("${_count} public headers installed, each including only installed headers")

set(_generated ${WORK_DIR}/generated)
file(WRITE ${_generated}/all_headers.cpp "// Every installed header, compiled by the host compiler.\n${_cpp}")
file(WRITE ${_generated}/all_headers.cu "// Every installed header, compiled by nvcc; a kernel using the host+device types.\n${_cpp}
__global__ void consumer_kernel(mixtape::Half* out, const mixtape::BFloat16* in) {
  out[threadIdx.x] = mixtape::Half(static_cast<float>(in[threadIdx.x]) * 2.0f);
}
")
set(_cuda_args -DCONSUMER_CUDA=OFF)
if(CUDA_COMPILER)
  set(_cuda_args -DCONSUMER_CUDA=ON -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
set(_sanitize_args)
if(SANITIZE)
  set(_sanitize_args "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer"
                     -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE})
endif()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DGENERATED_DIR=${_generated} ${_cuda_args}
     ${_sanitize_args})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/consumer)
if(CUDA_COMPILER)
  message("every installed header compiled by g++ and by nvcc (${CUDA_COMPILER})")
else()
  message("every installed header compiled by g++ (no nvcc in this build: the .cu consumer was not built)")
endif()
