# Builds every examples/<name>/ project the way a user builds theirs: lockstep installed into a
# prefix, then each example configured on its own with find_package(lockstep) against it.
#   cmake -DBUILD_DIR=build -DPREFIX=build/stage -DEXAMPLES=examples -DOUT=build/examples
#         [-DLAUNCHER=ccache] -P cmake/build_examples.cmake
foreach(var BUILD_DIR PREFIX EXAMPLES OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "build_examples.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
endfunction()

run("installing lockstep into ${PREFIX}" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
set(launcher "")
if(LAUNCHER)
  set(launcher -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
file(GLOB projects LIST_DIRECTORIES true ${EXAMPLES}/*)
foreach(project ${projects})
  if(NOT EXISTS ${project}/CMakeLists.txt)
    continue()
  endif()
  get_filename_component(name ${project} NAME)
  run("configuring example ${name}" ${CMAKE_COMMAND} -S ${project} -B ${OUT}/${name}
      -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=Release ${launcher})
  run("building example ${name}" ${CMAKE_COMMAND} --build ${OUT}/${name})
  message(STATUS "example ${name}: built against ${PREFIX}")
endforeach()
