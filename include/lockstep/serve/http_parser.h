#pragma once
// HTTP/1.1 request framing (RFC 9112): where one request ends and the next begins, with limits on
// every part a client controls. No sockets here: http_server.h feeds it what arrives.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::serve::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // percent-decoded, without the query: "/v2/models/convnet/infer"
  std::string query;   // after '?', as sent
  int minor_version = 1;  // HTTP/1.0 or HTTP/1.1
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
  std::string body;    // the payload, de-chunked

  // The first value of header `name` (lower case), or nullptr.
  const std::string* header(std::string_view name) const;
  // Whether the connection stays open after the response (HTTP/1.1 unless "Connection: close";
  // HTTP/1.0 only with "Connection: keep-alive").
  bool keep_alive() const;
};

struct ParserLimits {
  size_t max_header_bytes = 16 * 1024;  // the request line and header fields together: above, 431
  size_t max_body_bytes = 64 << 20;     // the payload in any framing: above, 413
};

// Note [One framing for every hop]
// A request's length is read one way only, so that no proxy in front can read it differently
// (request smuggling): a body comes with one Content-Length (repeated only with the same value) or
// with Transfer-Encoding: chunked alone; anything else is refused before a byte of the body is read.
// Lines end in CRLF; a header name is a token directly followed by ':'; folded header lines are
// refused. Each refusal carries its status: 400 malformed, 413 a body over the limit, 431 a header
// block over the limit, 501 a transfer coding other than chunked, 505 an HTTP version other than 1.x.

// Reads requests from a connection's bytes, one after another. feed() consumes what it can of the
// bytes that arrived; when status() is kComplete, take() returns the request and the parser starts
// on the next one (pipelined bytes after it are left to the next feed()).
class RequestParser {
 public:
  enum class Status { kIncomplete, kComplete, kError };

  explicit RequestParser(ParserLimits limits = {});

  // Consumes a prefix of `data` and returns its length. Bytes of a header block that is not yet
  // complete are not consumed: call again with them and what arrives next.
  size_t feed(std::string_view data);

  Status status() const { return status_; }
  // Whether the request has begun: a byte of it was consumed, or is waiting in an incomplete header block.
  bool started() const { return started_; }
  // The header block is read and the client waits for "100 Continue" before sending the body.
  bool awaits_continue() const;
  // With status() kError: the HTTP status to answer and why.
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // With status() kComplete: the request; the parser is then ready for the next one.
  Request take();

 private:
  enum class Phase { kHead, kFixedBody, kChunkSize, kChunkData, kChunkDataEnd, kTrailers };
  size_t feed_head(std::string_view data);
  size_t feed_chunked(std::string_view data);
  void parse_head(std::string_view head);
  void frame_body();
  void fail(int status, std::string message);
  size_t fail_now(int status, std::string message);  // fail(); returns 0 bytes consumed
  void reset();

  ParserLimits limits_;
  Status status_ = Status::kIncomplete;
  Phase phase_ = Phase::kHead;
  bool started_ = false;
  size_t scanned_ = 0;      // kHead: bytes of `data` already searched for the end of the block
  uint64_t remaining_ = 0;  // kFixedBody / kChunkData: payload bytes still to come
  size_t trailer_bytes_ = 0;
  Request request_;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace lockstep::serve::http
