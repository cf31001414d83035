# Writes CTEST_FILE: one ctest test per GoogleTest suite of TEST_EXECUTABLE, each running its suite
# in one process and writing GoogleTest's XML report to RESULTS_DIR/<suite>.xml.
#
# Note [One process per suite]
# gtest_discover_tests makes a ctest test of every test case, so the suite started ~700 processes,
# and each paid LibTorch's start (~0.4 s of dynamic relocation and operator registration on these
# machines): about a third of the suite's time. A suite's cases share a fixture and a subject, and
# run in one process as `lockstep_tests --gtest_filter=Suite.*` always could. ctest still reports
# every failing case in the suite's output, and scripts/check-skips reads the per-case results
# (skips and their reasons) from the XML files.
#
# Run as a POST_BUILD step: cmake -D TEST_EXECUTABLE=... -D CTEST_FILE=... -D RESULTS_DIR=...
#   -D TIMEOUT=... -D WORKING_DIRECTORY=... -P gtest_suites.cmake

execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE status TIMEOUT 60)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${status}):\n${listing}")
endif()

# Suite lines start in column 0 and end with '.', optionally followed by "  # TypeParam = ...".
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(content "# Written by cmake/gtest_suites.cmake from ${TEST_EXECUTABLE} --gtest_list_tests.\n")
set(count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(REPLACE "/" "_" file "${suite}")
    string(APPEND content
      "add_test([==[${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==] "
      "[==[--gtest_output=xml:${RESULTS_DIR}/${file}.xml]==])\n"
      "set_tests_properties([==[${suite}]==] PROPERTIES TIMEOUT ${TIMEOUT} "
      "WORKING_DIRECTORY [==[${WORKING_DIRECTORY}]==])\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "no test suites in the output of ${TEST_EXECUTABLE} --gtest_list_tests")
endif()
file(WRITE "${CTEST_FILE}" "${content}")
