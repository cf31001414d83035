# The protocol buffers `lockstep serve` compiles, into ${LOCKSTEP_PROTO_OUT} of the directory that
# includes this file (the library's, or the fuzz build's: a custom command's output is a source only
# in its own directory): src/serve/model_config.proto, the config.pbtxt subset it reads (protoc),
# and src/serve/grpc_service.proto, the KServe v2 gRPC service (protoc with gRPC's C++ plugin).
# LOCKSTEP_PROTO_SOURCES lists the generated sources to compile.
set(LOCKSTEP_PROTO_OUT ${CMAKE_CURRENT_BINARY_DIR}/generated)
add_custom_command(
  OUTPUT ${LOCKSTEP_PROTO_OUT}/model_config.pb.cc ${LOCKSTEP_PROTO_OUT}/model_config.pb.h
  COMMAND ${CMAKE_COMMAND} -E make_directory ${LOCKSTEP_PROTO_OUT}
  COMMAND protobuf::protoc --cpp_out=${LOCKSTEP_PROTO_OUT} -I ${PROJECT_SOURCE_DIR}/src/serve
          ${PROJECT_SOURCE_DIR}/src/serve/model_config.proto
  DEPENDS ${PROJECT_SOURCE_DIR}/src/serve/model_config.proto protobuf::protoc
  COMMENT "protoc src/serve/model_config.proto")
set(_lockstep_grpc_outputs ${LOCKSTEP_PROTO_OUT}/grpc_service.pb.cc ${LOCKSTEP_PROTO_OUT}/grpc_service.pb.h
                           ${LOCKSTEP_PROTO_OUT}/grpc_service.grpc.pb.cc ${LOCKSTEP_PROTO_OUT}/grpc_service.grpc.pb.h)
add_custom_command(
  OUTPUT ${_lockstep_grpc_outputs}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${LOCKSTEP_PROTO_OUT}
  COMMAND protobuf::protoc --cpp_out=${LOCKSTEP_PROTO_OUT} --grpc_out=${LOCKSTEP_PROTO_OUT}
          --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> -I ${PROJECT_SOURCE_DIR}/src/serve
          ${PROJECT_SOURCE_DIR}/src/serve/grpc_service.proto
  DEPENDS ${PROJECT_SOURCE_DIR}/src/serve/grpc_service.proto protobuf::protoc gRPC::grpc_cpp_plugin
  COMMENT "protoc src/serve/grpc_service.proto (with gRPC's C++ plugin)")
set(LOCKSTEP_PROTO_SOURCES ${LOCKSTEP_PROTO_OUT}/model_config.pb.cc ${LOCKSTEP_PROTO_OUT}/grpc_service.pb.cc
                           ${LOCKSTEP_PROTO_OUT}/grpc_service.grpc.pb.cc)
set_source_files_properties(${LOCKSTEP_PROTO_SOURCES} PROPERTIES SKIP_PRECOMPILE_HEADERS ON
                            SKIP_UNITY_BUILD_INCLUSION ON)
