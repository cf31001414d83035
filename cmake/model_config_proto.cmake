# The config.pbtxt subset `lockstep serve` reads (src/serve/model_config.proto), compiled by protoc
# into ${LOCKSTEP_PROTO_OUT} of the directory that includes this file (the library's, or the fuzz
# build's: a custom command's output is a source only in its own directory).
set(LOCKSTEP_PROTO_OUT ${CMAKE_CURRENT_BINARY_DIR}/generated)
add_custom_command(
  OUTPUT ${LOCKSTEP_PROTO_OUT}/model_config.pb.cc ${LOCKSTEP_PROTO_OUT}/model_config.pb.h
  COMMAND ${CMAKE_COMMAND} -E make_directory ${LOCKSTEP_PROTO_OUT}
  COMMAND protobuf::protoc --cpp_out=${LOCKSTEP_PROTO_OUT} -I ${PROJECT_SOURCE_DIR}/src/serve
          ${PROJECT_SOURCE_DIR}/src/serve/model_config.proto
  DEPENDS ${PROJECT_SOURCE_DIR}/src/serve/model_config.proto protobuf::protoc
  COMMENT "protoc src/serve/model_config.proto")
set_source_files_properties(${LOCKSTEP_PROTO_OUT}/model_config.pb.cc PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
