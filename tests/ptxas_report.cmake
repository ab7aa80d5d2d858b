# tests/ptxas_report.cmake — reads ptxas's resource report (nvcc --resource-usage), for the cmake -P checks.
#
# mixtape_ptxas_spills(<text> <function regex> <label> <checked var> <failures var>)
# ptxas prints "Function properties for <mangled name>" and, on the next line, "N bytes stack frame,
# N bytes spill stores, N bytes spill loads". For each function whose name matches the regex this
# counts one check into <checked var> and appends "<label>: <function>: <report>" to <failures var>
# when any of the three is non-zero (a spill, or a stack frame: local memory either way).
function(mixtape_ptxas_spills text function_regex label checked_var failures_var)
  string(REPLACE ";" "," _text "${text}")
  string(REPLACE "\n" ";" _lines "${_text}")
  set(_function "")
  set(_checked 0)
  set(_failures "${${failures_var}}")
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "Function properties for ([A-Za-z0-9_$.]+)")
      set(_function "${CMAKE_MATCH_1}")
    elseif(_line MATCHES "([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads")
      # Saved first: the next MATCHES overwrites CMAKE_MATCH_*.
      set(_report "${CMAKE_MATCH_0}")
      set(_stack "${CMAKE_MATCH_1}")
      set(_stores "${CMAKE_MATCH_2}")
      set(_loads "${CMAKE_MATCH_3}")
      if(_function MATCHES "${function_regex}")
        math(EXPR _checked "${_checked} + 1")
        if(NOT _stack EQUAL 0 OR NOT _stores EQUAL 0 OR NOT _loads EQUAL 0)
          string(APPEND _failures "\n  ${label}: ${_function}: ${_report}")
        endif()
      endif()
      set(_function "")
    endif()
  endforeach()
  set(${checked_var} ${_checked} PARENT_SCOPE)
  set(${failures_var} "${_failures}" PARENT_SCOPE)
endfunction()
