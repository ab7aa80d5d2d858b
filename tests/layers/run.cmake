# tests/layers/run.cmake — ctest driver: the build refuses includes against DESIGN.md's arrows.
#
# Each probe tests/layers/<layer>_sees_<what>.cpp or <layer>_cannot_see_<what>.cpp is an object target compiled
# with exactly the include roots of mixtape_<layer> (tests/CMakeLists.txt). A "sees" probe must compile; a
# "cannot_see" probe must fail, and fail because the header is not found (not for some other reason).
#   cmake -DBUILD_DIR=<build> -DPROBES=a,b,... -P run.cmake
string(REPLACE "," ";" _probes "${PROBES}")
set(_failures "")
foreach(_probe IN LISTS _probes)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target layer_probe_${_probe}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(_probe MATCHES "_cannot_see_")
    if(_rc EQUAL 0)
      string(APPEND _failures "\n  ${_probe}: compiled, but its layer must not see that header")
    elseif(NOT "${_out}${_err}" MATCHES "No such file or directory|file not found")  # GCC's words, clang's
      string(APPEND _failures "\n  ${_probe}: failed for another reason than a missing header:\n${_out}${_err}")
    else()
      message(STATUS "${_probe}: refused, as it must be")
    endif()
  elseif(NOT _rc EQUAL 0)
    string(APPEND _failures "\n  ${_probe}: did not compile, but its layer may see that header:\n${_out}${_err}")
  else()
    message(STATUS "${_probe}: compiles")
  endif()
endforeach()
if(NOT _failures STREQUAL "")
  message(FATAL_ERROR "check_layers:${_failures}")
endif()
