// The request framing parser: every request is read the same whether its bytes arrive at once or
// one by one, pipelined requests are told apart, and each malformed, ambiguous or oversized
// request is refused with its status as soon as its bytes show it.
#include "lockstep/serve/http_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep::serve::http {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  RequestParser::Status status;
  std::vector<Request> requests;
  int error_status = 0;
  std::string error;
  size_t leftover = 0;  // bytes not consumed
};

// Feeds `bytes` in pieces of `piece` bytes as a connection would: unconsumed bytes stay buffered.
Outcome parse(const std::string& bytes, size_t piece, ParserLimits limits = {}) {
  RequestParser parser(limits);
  Outcome out;
  std::string buffered;
  for (size_t at = 0; at < bytes.size() || !buffered.empty();) {
    const size_t n = std::min(piece, bytes.size() - at);
    buffered += bytes.substr(at, n);
    at += n;
    buffered.erase(0, parser.feed(buffered));
    while (parser.status() == RequestParser::Status::kComplete) {
      out.requests.push_back(parser.take());
      buffered.erase(0, parser.feed(buffered));
    }
    if (parser.status() == RequestParser::Status::kError || (n == 0 && at == bytes.size())) break;
  }
  out.status = parser.status();
  out.error_status = parser.error_status();
  out.error = parser.error_message();
  out.leftover = buffered.size();
  return out;
}

TEST(RequestParser, ReadsARequestLineHeadersAndBody) {
  const Outcome o = parse("POST /v2/models/conv%6Eet/infer?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type:  text/plain \r\n"
                          "Content-Length: 5\r\n\r\nhello", 1 << 20);
  ASSERT_EQ(o.requests.size(), 1u) << o.error;
  const Request& r = o.requests[0];
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v2/models/convnet/infer");  // percent-decoded
  EXPECT_EQ(r.query, "x=1");
  EXPECT_EQ(r.minor_version, 1);
  ASSERT_NE(r.header("content-type"), nullptr);
  EXPECT_EQ(*r.header("content-type"), "text/plain");  // names lower-cased, values trimmed
  EXPECT_EQ(r.body, "hello");
  EXPECT_TRUE(r.keep_alive());
}

TEST(RequestParser, ByteByByteReadsTheSameRequestsAsAllAtOnce) {
  const std::string pipelined =
      "\r\nGET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
      "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nwiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks."
      "\r\n0\r\nTrailer: x\r\n\r\n"
      "POST /b HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
  for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, size_t{1} << 20}) {
    const Outcome o = parse(pipelined, piece);
    ASSERT_EQ(o.requests.size(), 3u) << "pieces of " << piece << ": " << o.error;
    EXPECT_EQ(o.requests[0].minor_version, 0);
    EXPECT_TRUE(o.requests[0].keep_alive());
    EXPECT_EQ(o.requests[1].body, "wikipedia in\r\n\r\nchunks.");
    EXPECT_EQ(o.requests[2].body, "abc");  // two equal Content-Lengths are one (RFC 9110 8.6)
    EXPECT_FALSE(o.requests[2].keep_alive());
    EXPECT_EQ(o.leftover, 0u);
    EXPECT_EQ(o.status, RequestParser::Status::kIncomplete);
  }
}

TEST(RequestParser, HttpOneZeroClosesUnlessKeptAlive) {
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n", 64).requests.at(0).keep_alive());
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n", 64).requests.at(0).keep_alive());
}

TEST(RequestParser, AwaitsContinueOnlyBeforeTheBody) {
  RequestParser parser;
  const std::string head = "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  EXPECT_EQ(parser.feed(head), head.size());
  EXPECT_TRUE(parser.awaits_continue());
  parser.feed("a");
  EXPECT_FALSE(parser.awaits_continue());
}

struct BadRequest {
  std::string what, bytes;
  int status;
  std::string message;
};

class RefusedRequest : public ::testing::TestWithParam<BadRequest> {};

// Each is refused, in one piece and byte by byte, without waiting for more bytes than show it.
TEST_P(RefusedRequest, IsAnsweredWithItsStatus) {
  const BadRequest& b = GetParam();
  ParserLimits limits;
  limits.max_header_bytes = 1024;
  limits.max_body_bytes = 100;
  for (size_t piece : {size_t{1}, size_t{1} << 20}) {
    const Outcome o = parse(b.bytes, piece, limits);
    ASSERT_EQ(o.status, RequestParser::Status::kError) << b.what << " in pieces of " << piece;
    EXPECT_EQ(o.error_status, b.status) << b.what << ": " << o.error;
    EXPECT_THAT(o.error, HasSubstr(b.message)) << b.what;
    EXPECT_TRUE(o.requests.empty()) << b.what;
  }
}

const std::string kPost = "POST /v2/models/m/infer HTTP/1.1\r\nHost: a\r\n";

INSTANTIATE_TEST_SUITE_P(
    Framing, RefusedRequest,
    ::testing::Values(
        BadRequest{"http 0.9", "GET /\r\n", 400, "is not METHOD /path HTTP/1.1"},
        BadRequest{"an HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "HTTP version 2.0 is not served"},
        BadRequest{"a TLS client hello", std::string("\x16\x03\x01\x02\x00\x01", 6), 400,
                   "does not start with an HTTP method: '\\x16"},
        BadRequest{"a header block over the limit", "GET / HTTP/1.1\r\nX: " + std::string(2000, 'a'), 431,
                   "over 1024 bytes"},
        BadRequest{"a request line over the limit", "GET /" + std::string(2000, 'a'), 414, "longer than 1024"},
        BadRequest{"a request line ending in LF", "GET / HTTP/1.1\nHost: a\n\n", 400, "ends in LF without CR"},
        BadRequest{"a bare LF in a header", "GET / HTTP/1.1\r\nA: b\nC: d\r\n\r\n", 400, "bare CR or LF"},
        BadRequest{"two Content-Lengths", kPost + "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}", 400,
                   "Content-Length headers that differ"},
        BadRequest{"a list of two lengths", kPost + "Content-Length: 2, 3\r\n\r\n{}", 400, "differ"},
        BadRequest{"Content-Length and chunked", kPost + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
                   "both a Content-Length and chunked"},
        BadRequest{"a coding other than chunked", kPost + "Transfer-Encoding: gzip, chunked\r\n\r\n", 501,
                   "Transfer-Encoding 'gzip, chunked' is not supported"},
        BadRequest{"a signed length", kPost + "Content-Length: +2\r\n\r\n{}", 400, "'+2' is not a byte count"},
        BadRequest{"an empty length", kPost + "Content-Length:\r\n\r\n", 400, "Content-Length is empty"},
        BadRequest{"a length over the limit", kPost + "Content-Length: 101\r\n\r\n", 413,
                   "body of 101 bytes is over the size limit of 100"},
        BadRequest{"a huge length", kPost + "Content-Length: 99999999999999999999999\r\n\r\n", 413, "over the size limit"},
        BadRequest{"chunks over the limit", kPost + "Transfer-Encoding: chunked\r\n\r\n40\r\n" + std::string(64, 'x') +
                                                "\r\n40\r\n",
                   413, "chunked request body is over the size limit of 100"},
        BadRequest{"a chunk size of 17 digits", kPost + "Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n", 400,
                   "is not a hexadecimal size"},
        BadRequest{"chunk data without CRLF", kPost + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}xx", 400,
                   "not followed by CRLF"},
        BadRequest{"a space before the colon", kPost + "Content-Length : 2\r\n\r\n{}", 400, "is not NAME: VALUE"},
        BadRequest{"a folded header", kPost + "X: a\r\n b\r\n\r\n", 400, "obsolete line folding"},
        BadRequest{"a NUL in a value", kPost + std::string("X: a\0b\r\n\r\n", 10), 400, "control byte"},
        BadRequest{"a percent-encoded NUL", "GET /v2/models/a%00b HTTP/1.1\r\n\r\n", 400, "bad percent-encoding"},
        BadRequest{"an absolute URI", "GET http://x/v2 HTTP/1.1\r\n\r\n", 400, "not a path starting with '/'"}),
    [](const auto& info) {
      std::string name;
      for (char c : info.param.what) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

}  // namespace
}  // namespace lockstep::serve::http
