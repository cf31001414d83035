#include "lockstep/serve/http_parser.h"

#include <algorithm>
#include <cctype>

namespace lockstep::serve::http {
namespace {

constexpr size_t kMaxChunkLine = 4096;  // a chunk's size line with its extensions
constexpr size_t kMaxLengthDigits = 18;  // fits in int64 whatever the digits

// RFC 9110's tchar: the characters of a method or a header name.
bool is_token_char(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_token_char(static_cast<unsigned char>(c)); });
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// The comma-separated elements of every `name` header, trimmed and lower-cased ("a, b" and two headers alike).
std::vector<std::string> list_values(const Request& request, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& [key, value] : request.headers) {
    if (key != name) continue;
    std::string_view rest = value;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view item = trim(rest.substr(0, comma));
      if (!item.empty()) out.push_back(lower(item));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Printable text as it may appear in a message: control bytes escaped, at most 60 characters.
std::string printable(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 60)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      static const char* digits = "0123456789abcdef";
      out += "\\x";
      out += digits[u >> 4];
      out += digits[u & 15];
    }
  }
  return out + (s.size() > 60 ? "...'" : "'");
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (key == name) return &value;
  return nullptr;
}

bool Request::keep_alive() const {
  const std::vector<std::string> options = list_values(*this, "connection");
  if (std::count(options.begin(), options.end(), "close") > 0) return false;
  return minor_version >= 1 || std::count(options.begin(), options.end(), "keep-alive") > 0;
}

RequestParser::RequestParser(ParserLimits limits) : limits_(limits) {}

bool RequestParser::awaits_continue() const {
  if (status_ != Status::kIncomplete || phase_ == Phase::kHead || !request_.body.empty()) return false;
  const std::string* expect = request_.header("expect");
  return expect != nullptr && lower(*expect) == "100-continue";
}

void RequestParser::fail(int status, std::string message) {
  status_ = Status::kError;
  error_status_ = status;
  error_message_ = std::move(message);
}

size_t RequestParser::fail_now(int status, std::string message) {
  fail(status, std::move(message));
  return 0;
}

void RequestParser::reset() {
  *this = RequestParser(limits_);
}

Request RequestParser::take() {
  Request out = std::move(request_);
  reset();
  return out;
}

size_t RequestParser::feed(std::string_view data) {
  size_t used = 0;
  while (status_ == Status::kIncomplete && used < data.size()) {
    const std::string_view rest = data.substr(used);
    size_t n = 0;
    if (phase_ == Phase::kHead) {
      n = feed_head(rest);
    } else if (phase_ == Phase::kFixedBody) {
      n = static_cast<size_t>(std::min<uint64_t>(remaining_, rest.size()));
      request_.body.append(rest.data(), n);
      remaining_ -= n;
      if (remaining_ == 0) status_ = Status::kComplete;
    } else {
      n = feed_chunked(rest);
    }
    if (n == 0) break;  // the rest is an incomplete line: wait for more
    used += n;
  }
  return used;
}

size_t RequestParser::feed_head(std::string_view data) {
  // Empty lines before a request are skipped (RFC 9112 section 2.2), e.g. a client's stray CRLF
  // after a body.
  if (!started_ && scanned_ == 0 && data[0] == '\r' && (data.size() == 1 || data[1] == '\n'))
    return data.size() == 1 ? 0 : 2;
  started_ = true;
  // Garbage is refused at once, not when the limit or the timeout is reached: the method must be
  // a token and end at the first space, and the request line is checked as soon as it ends. The
  // checks are the same however the bytes are split into reads (the fuzz target holds us to it).
  const size_t line_end = data.find('\n');
  const std::string_view window = data.substr(0, limits_.max_header_bytes + 1);  // what a limit check sees
  const std::string_view method = window.substr(0, std::min(window.find(' '), window.find('\n')));
  for (size_t i = std::min(scanned_, method.size()); i < method.size(); ++i)
    if (!is_token_char(static_cast<unsigned char>(method[i])))
      return fail_now(400, "the request does not start with an HTTP method: " + printable(data.substr(0, 16)));
  if ((line_end == std::string_view::npos ? data.size() : line_end) > limits_.max_header_bytes)
    return fail_now(414, "the request line is longer than " + std::to_string(limits_.max_header_bytes) + " bytes");
  if (line_end != std::string_view::npos) {
    parse_head(data.substr(0, line_end > 0 && data[line_end - 1] == '\r' ? line_end - 1 : line_end));
    request_ = Request{};
    if (status_ == Status::kError) return 0;
    if (line_end == 0 || data[line_end - 1] != '\r') return fail_now(400, "the request line ends in LF without CR");
  }
  const size_t end = data.find("\r\n\r\n", scanned_ >= 3 ? scanned_ - 3 : 0);
  if (end == std::string_view::npos || end + 4 > limits_.max_header_bytes) {
    if (data.size() > limits_.max_header_bytes || end != std::string_view::npos)
      return fail_now(431, "the request line and headers are over " + std::to_string(limits_.max_header_bytes) + " bytes");
    scanned_ = data.size();
    return 0;
  }
  parse_head(data.substr(0, end));
  if (status_ == Status::kIncomplete) frame_body();
  return end + 4;
}

// `head`: the request line and the header lines, separated by CRLF, without the empty line.
void RequestParser::parse_head(std::string_view head) {
  size_t line_number = 0;
  while (status_ == Status::kIncomplete) {
    const size_t crlf = head.find("\r\n");
    const std::string_view line = head.substr(0, crlf);
    if (line.find_first_of("\r\n") != std::string_view::npos)
      return fail(400, "a line of the request ends in a bare CR or LF; lines end in CRLF");
    if (line_number++ == 0) {
      const size_t a = line.find(' '), b = a == std::string_view::npos ? a : line.find(' ', a + 1);
      if (b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos)
        return fail(400, "the request line " + printable(line) + " is not METHOD /path HTTP/1.1");
      request_.method = std::string(line.substr(0, a));
      const std::string_view target = line.substr(a + 1, b - a - 1), version = line.substr(b + 1);
      if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || !std::isdigit(version[5]) ||
          !std::isdigit(version[7]))
        return fail(400, "the request line " + printable(line) + " does not end in an HTTP version");
      if (version[5] != '1') return fail(505, "HTTP version " + std::string(version.substr(5)) + " is not served; use 1.1");
      request_.minor_version = version[7] - '0';
      if (target.empty() || target[0] != '/')
        return fail(400, "the request target " + printable(target) + " is not a path starting with '/'");
      const size_t question = target.find('?');
      const std::string_view path = target.substr(0, question);
      if (question != std::string_view::npos) request_.query = std::string(target.substr(question + 1));
      for (size_t i = 0; i < path.size(); ++i) {
        const auto c = static_cast<unsigned char>(path[i]);
        if (c <= 0x20 || c >= 0x7f) return fail(400, "the request target " + printable(target) + " has a control byte");
        if (c != '%') {
          request_.path += static_cast<char>(c);
          continue;
        }
        const int hi = i + 2 < path.size() ? hex_value(path[i + 1]) : -1, lo = hi >= 0 ? hex_value(path[i + 2]) : -1;
        if (lo < 0 || (hi == 0 && lo == 0))
          return fail(400, "the request target " + printable(target) + " has a bad percent-encoding");
        request_.path += static_cast<char>(hi * 16 + lo);
        i += 2;
      }
    } else {
      const size_t colon = line.find(':');
      const std::string_view name = line.substr(0, colon);
      if (!line.empty() && (line[0] == ' ' || line[0] == '\t'))
        return fail(400, "a header line starts with whitespace (obsolete line folding); send each header on one line");
      if (colon == std::string_view::npos || !is_token(name))
        return fail(400, "the header line " + printable(line) + " is not NAME: VALUE");
      const std::string_view value = trim(line.substr(colon + 1));
      if (std::any_of(value.begin(), value.end(), [](char c) { return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f; }))
        return fail(400, "the header '" + std::string(name) + "' has a control byte in its value");
      request_.headers.emplace_back(lower(name), std::string(value));
    }
    if (crlf == std::string_view::npos) break;
    head.remove_prefix(crlf + 2);
  }
}

// Decides how the body is framed. See Note [One framing for every hop].
void RequestParser::frame_body() {
  const std::vector<std::string> codings = list_values(request_, "transfer-encoding");
  const std::vector<std::string> lengths = list_values(request_, "content-length");
  if (request_.header("transfer-encoding") != nullptr) {
    if (request_.header("content-length") != nullptr) return fail(400, "the request has both a Content-Length and chunked encoding; send one of them");
    if (codings != std::vector<std::string>{"chunked"})
      return fail(501, "Transfer-Encoding '" + *request_.header("transfer-encoding") +
                           "' is not supported; send the body chunked or with a Content-Length");
    phase_ = Phase::kChunkSize;
    return;
  }
  if (request_.header("content-length") == nullptr) {
    status_ = Status::kComplete;
    return;
  }
  if (lengths.empty()) return fail(400, "Content-Length is empty; give the body's size in bytes");
  for (const std::string& l : lengths) {
    if (l.find_first_not_of("0123456789") != std::string::npos)
      return fail(400, "Content-Length " + printable(l) + " is not a byte count");
    if (l != lengths[0]) return fail(400, "the request has Content-Length headers that differ; send one");
  }
  const std::string digits = lengths[0].substr(std::min(lengths[0].find_first_not_of('0'), lengths[0].size() - 1));
  if (digits.size() > kMaxLengthDigits || std::stoull(digits) > limits_.max_body_bytes)
    return fail(413, "the request body of " + digits + " bytes is over the size limit of " +
                         std::to_string(limits_.max_body_bytes) + " bytes");
  remaining_ = std::stoull(digits);
  phase_ = Phase::kFixedBody;
  if (remaining_ == 0) status_ = Status::kComplete;
}

size_t RequestParser::feed_chunked(std::string_view data) {
  size_t used = 0;
  while (status_ == Status::kIncomplete && used < data.size()) {
    const std::string_view rest = data.substr(used);
    if (phase_ == Phase::kChunkData) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, rest.size()));
      request_.body.append(rest.data(), n);
      remaining_ -= n;
      used += n;
      if (remaining_ == 0) phase_ = Phase::kChunkDataEnd;
      continue;
    }
    if (phase_ == Phase::kChunkDataEnd) {
      if (rest.size() < 2) break;
      if (rest.substr(0, 2) != "\r\n") return fail_now(400, "a chunk's data is not followed by CRLF");
      used += 2;
      phase_ = Phase::kChunkSize;
      continue;
    }
    // The line with its CRLF must fit in `bound`; judged the same whether the line is whole or its
    // bytes so far (at `bound` bytes without CRLF it cannot fit).
    const size_t crlf = rest.find("\r\n");
    const size_t bound = phase_ == Phase::kChunkSize                    ? kMaxChunkLine
                         : trailer_bytes_ >= limits_.max_header_bytes ? 0
                                                                      : limits_.max_header_bytes - trailer_bytes_;
    if (crlf == std::string_view::npos || crlf + 2 > bound) {
      if (crlf == std::string_view::npos && rest.size() < bound) break;  // wait for the rest of the line
      return fail_now(phase_ == Phase::kChunkSize ? 400 : 431,
                  phase_ == Phase::kChunkSize ? "a chunk size line is over " + std::to_string(kMaxChunkLine) + " bytes"
                                              : "the chunked body's trailers are over the header size limit");
    }
    const std::string_view line = rest.substr(0, crlf);
    used += crlf + 2;
    if (phase_ == Phase::kTrailers) {
      trailer_bytes_ += crlf + 2;
      if (line.empty()) status_ = Status::kComplete;  // trailer fields are read and dropped
      continue;
    }
    const size_t digits = std::min(line.find_first_not_of("0123456789abcdefABCDEF"), line.size());
    const std::string_view after = trim(line.substr(digits));
    if (digits == 0 || digits > 16 || (!after.empty() && after[0] != ';'))
      return fail_now(400, "the chunk size line " + printable(line) + " is not a hexadecimal size");
    uint64_t size = 0;
    for (size_t i = 0; i < digits; ++i) size = size * 16 + static_cast<uint64_t>(hex_value(line[i]));
    if (size > limits_.max_body_bytes - request_.body.size())
      return fail_now(413, "the chunked request body is over the size limit of " + std::to_string(limits_.max_body_bytes) +
                           " bytes");
    remaining_ = size;
    phase_ = size == 0 ? Phase::kTrailers : Phase::kChunkData;
  }
  return used;
}

}  // namespace lockstep::serve::http
