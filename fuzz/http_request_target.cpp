#include "lockstep/serve/http_parser.h"
#include "targets.h"

namespace lockstep::fuzz {
namespace {

using serve::http::Request;
using serve::http::RequestParser;

// What a connection's parser made of its bytes: the requests in order, then how it stopped.
struct Reading {
  std::vector<Request> requests;
  RequestParser::Status status = RequestParser::Status::kIncomplete;
  int error_status = 0;
};

// Feeds `bytes` in reads of `piece` bytes, keeping what the parser did not consume, as
// serve::http::HttpServer does.
Reading read_all(std::string_view bytes, size_t piece, serve::http::ParserLimits limits) {
  RequestParser parser(limits);
  Reading out;
  std::string buffered;
  for (size_t at = 0; at < bytes.size() && parser.status() != RequestParser::Status::kError;) {
    const size_t n = std::min(piece, bytes.size() - at);
    buffered.append(bytes.substr(at, n));
    at += n;
    while (true) {
      const size_t used = parser.feed(buffered);
      if (used > buffered.size()) throw Violation("feed() consumed more bytes than it was given");
      buffered.erase(0, used);
      if (parser.status() != RequestParser::Status::kComplete) break;
      out.requests.push_back(parser.take());
      if (out.requests.back().body.size() > limits.max_body_bytes)
        throw Violation("a request body of " + std::to_string(out.requests.back().body.size()) +
                        " bytes passed the limit of " + std::to_string(limits.max_body_bytes));
    }
  }
  out.status = parser.status();
  out.error_status = parser.error_status();
  return out;
}

bool same(const Request& a, const Request& b) {
  return a.method == b.method && a.path == b.path && a.query == b.query && a.minor_version == b.minor_version &&
         a.headers == b.headers && a.body == b.body;
}

}  // namespace

void http_request_input(const uint8_t* data, size_t size) {
  if (size == 0) return;
  // Small limits, so that the fuzzer reaches them.
  serve::http::ParserLimits limits;
  limits.max_header_bytes = 256;
  limits.max_body_bytes = 512;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Reading whole = read_all(bytes, bytes.size() + 1, limits);
  const Reading pieces = read_all(bytes, 1 + data[0] % 13, limits);
  // A request reads the same however TCP splits it: otherwise a proxy and this server could frame
  // it differently.
  if (whole.requests.size() != pieces.requests.size() || whole.status != pieces.status ||
      whole.error_status != pieces.error_status)
    throw Violation("read at once: " + std::to_string(whole.requests.size()) + " request(s), then status " +
                    std::to_string(whole.error_status) + "; in reads of " + std::to_string(1 + data[0] % 13) +
                    " bytes: " + std::to_string(pieces.requests.size()) + ", then " +
                    std::to_string(pieces.error_status));
  for (size_t i = 0; i < whole.requests.size(); ++i)
    if (!same(whole.requests[i], pieces.requests[i]))
      throw Violation("request " + std::to_string(i) + " reads differently when split into reads");
}

}  // namespace lockstep::fuzz
