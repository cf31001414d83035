// A closed-loop gRPC load for `lockstep serve` (Triton's perf_analyzer is not on the PyPI these
// machines reach): CONCURRENCY ModelInfer calls in flight on one channel, each answered call
// replaced by the next until REQUESTS have been answered; one JSON line with requests/s and the
// latencies. Built by bench/serve_grpc_vs_http.sh against lockstep's own generated service code.
//
// Usage: grpc_load HOST:PORT MODEL INPUT REQUESTS CONCURRENCY   (input: FP32 (1,1,28,28) zeros)
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "grpc_service.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Load {
  inference::GRPCInferenceService::Stub* stub;
  inference::ModelInferRequest request;
  int64_t total;
  std::atomic<int64_t> started{0};
  std::mutex mutex;
  std::condition_variable done_cv;
  int64_t done = 0, failed = 0;
  std::vector<double> latencies_ms;
};

struct Call {
  grpc::ClientContext context;
  inference::ModelInferResponse response;
  Clock::time_point start;
};

void start_one(Load& load) {
  if (load.started.fetch_add(1) >= load.total) return;
  auto* call = new Call;
  call->start = Clock::now();
  load.stub->async()->ModelInfer(&call->context, &load.request, &call->response, [&load, call](grpc::Status s) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - call->start).count();
    delete call;
    {
      std::lock_guard<std::mutex> lock(load.mutex);
      load.latencies_ms.push_back(ms);
      load.failed += s.ok() ? 0 : 1;
      ++load.done;
    }
    load.done_cv.notify_all();
    start_one(load);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: grpc_load HOST:PORT MODEL INPUT REQUESTS CONCURRENCY\n");
    return 2;
  }
  auto channel = grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  Load load;
  load.stub = stub.get();
  load.total = std::atoll(argv[4]);
  const int concurrency = std::atoi(argv[5]);
  load.request.set_model_name(argv[2]);
  auto* input = load.request.add_inputs();
  input->set_name(argv[3]);
  input->set_datatype("FP32");
  for (int64_t d : {1, 1, 28, 28}) input->add_shape(d);
  load.request.add_raw_input_contents(std::string(28 * 28 * sizeof(float), '\0'));
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < concurrency; ++i) start_one(load);
  std::unique_lock<std::mutex> lock(load.mutex);
  load.done_cv.wait(lock, [&] { return load.done == load.total; });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(load.latencies_ms.begin(), load.latencies_ms.end());
  auto at = [&](double q) { return load.latencies_ms[static_cast<size_t>(q * (load.latencies_ms.size() - 1))]; };
  std::printf("{\"requests\": %lld, \"failed\": %lld, \"seconds\": %.3f, \"rps\": %.1f, \"p50_ms\": %.3f, "
              "\"p99_ms\": %.3f}\n",
              static_cast<long long>(load.total), static_cast<long long>(load.failed), seconds, load.total / seconds,
              at(0.5), at(0.99));
  return load.failed == 0 ? 0 : 1;
}
