#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "lockstep/core/torch_load.h"

namespace lockstep::detail {
namespace {

// Note [OrderedDict in LibTorch's unpickler]
// Python's model.state_dict() is a collections.OrderedDict carrying a `_metadata` attribute (each
// module's serialization version). torch.save pickles it (protocol 2) as
//   GLOBAL 'collections OrderedDict', EMPTY_TUPLE, REDUCE, MARK, key, tensor, ..., SETITEMS,
//   {'_metadata': OrderedDict(...)}, BUILD
// LibTorch 1.13's unpickler expects OrderedDict only as a tensor's (ignored) backward hooks: every
// OrderedDict() becomes None, so the SETITEMS that follows fails ("Expected GenericDict but got
// None"). It runs BUILD like REDUCE (the dict taken for a function) and knows neither POP,
// SETITEM nor APPEND. So before unpickling, the opcodes are rewritten:
//   the OrderedDict class (its GLOBAL, and BINPUT/BINGET of it)  ->  nothing
//   OrderedDict() (EMPTY_TUPLE, REDUCE)                          ->  EMPTY_DICT
//   STATE BUILD on such a dict (the _metadata attribute)         ->  nothing
//   KEY VALUE SETITEM (a dict of one entry)                      ->  MARK KEY VALUE SETITEMS
//   VALUE APPEND (a list of one element)                         ->  MARK VALUE APPENDS
// A dict keeps insertion order as OrderedDict does; the module versions in _metadata are not
// needed (lockstep's modules have one layout each). A stream that uses the class any other way,
// that later refers to a dropped value, or that the walker does not follow, is passed on
// untouched for the unpickler to judge.
//
// Note [Pickle nesting depth]
// LibTorch builds and destroys nested lists, dicts and tuples recursively: a pickle of 200,000
// nested lists (600 kB) overflows the stack (found by fuzz/ state_dict). The walker tracks every
// container's nesting depth and refuses streams deeper than kMaxNesting; Python's own pickler
// stops near 1000 (its recursion limit), and a state dict or checkpoint is a few levels deep.
constexpr uint32_t kMaxNesting = 1000;

// Note [Integers and protocols LibTorch's unpickler does not read]
// Python pickles an int beyond BININT's 32 bits as LONG1 with as few bytes as hold it (5 for
// 5,000,000,000), and LibTorch's unpickler reads only 8-byte LONG1s ("Expected length to be 8, got
// 5"). The walker widens every LONG1 of 0-7 bytes to 8, sign-extended; one of more than 8 bytes does
// not fit int64 and is refused saying so. Protocol 4 and 5 (torch.save(..., pickle_protocol=4))
// frame the stream and name classes with STACK_GLOBAL and memoize with MEMOIZE, none of which
// LibTorch reads: such a stream is refused at its PROTO opcode naming the protocol and the fix.

class OrderedDictRewriter {
 public:
  explicit OrderedDictRewriter(std::vector<char> bytes) : in_(std::move(bytes)) {}

  // The rewritten pickle, or the original bytes when they are not a pickle this walker follows.
  // Throws c10::Error naming the offset of the first opcode that is malformed.
  std::vector<char> run() && {
    const std::optional<size_t> bad = walk();
    TORCH_CHECK(!too_deep_, "its pickle (data.pkl) nests containers more than ", kMaxNesting,
                " deep at byte ", bad.value_or(0), " of ", in_.size());
    TORCH_CHECK(why_.empty(), "its pickle (data.pkl) ", why_, " (byte ", bad.value_or(0), " of ", in_.size(), ")");
    TORCH_CHECK(!bad, "its pickle (data.pkl) is malformed at byte ", bad.value_or(0), " of ", in_.size(),
                bad.value_or(0) < in_.size() ? c10::str(" (opcode 0x", std::hex,
                                                        int(static_cast<unsigned char>(in_[bad.value_or(0)])), ")")
                                             : std::string(" (no STOP opcode)"));
    if (!changed_) return std::move(in_);
    std::vector<char> out;
    out.reserve(in_.size() + 64);
    for (const auto& [at, size] : ops_) {
      if (drop_.count(at) || dropped(at)) continue;
      if (mark_before_.count(at)) out.push_back('(');
      if (const auto r = rewritten_.find(at); r != rewritten_.end()) {
        out.insert(out.end(), r->second.begin(), r->second.end());
        continue;
      }
      if (const auto r = replace_.find(at); r != replace_.end()) {
        out.push_back(r->second);
        continue;
      }
      out.insert(out.end(), in_.begin() + static_cast<std::ptrdiff_t>(at),
                 in_.begin() + static_cast<std::ptrdiff_t>(at + size));
    }
    return out;
  }

 private:
  enum class Tag { kMark, kOther, kOrderedDictClass, kOrderedDict };
  struct Entry {
    Tag tag;
    size_t start;     // offset of the first opcode that built this value
    uint32_t id = 0;  // index into depth_ of a container; 0 for scalars and strings
  };
  struct Memo {
    Tag tag;
    size_t defined_at;  // offset of the BINPUT
    uint32_t id;
  };

  // A new container, holding values `child_depth` deep. See Note [Pickle nesting depth].
  Entry container(Tag tag, size_t start, uint32_t child_depth) {
    depth_.push_back(child_depth + 1);
    return {tag, start, static_cast<uint32_t>(depth_.size() - 1)};
  }
  uint32_t depth(const Entry& e) const { return depth_[e.id]; }
  // Records that `e` (on the stack) now holds a value `child_depth` deep; false when too deep.
  bool nest(Entry& e, uint32_t child_depth) {
    if (e.id == 0) e = container(e.tag, e.start, 0);
    depth_[e.id] = std::max(depth_[e.id], child_depth + 1);
    too_deep_ = depth_[e.id] > kMaxNesting;
    return !too_deep_;
  }

  bool dropped(size_t at) const {
    return std::any_of(dropped_ranges_.begin(), dropped_ranges_.end(),
                       [at](const auto& r) { return at >= r.first && at <= r.second; });
  }

  // The offset of the first opcode that is malformed or not one a state dict is written with; the
  // end of the stream when it has no STOP; nullopt when the whole stream is sound.
  std::optional<size_t> walk() {
    size_t pos = 0;
    while (pos < in_.size()) {
      const size_t at = pos;
      const auto op = static_cast<unsigned char>(in_[pos++]);
      if (!step(op, at, pos)) return at;
      ops_.emplace_back(at, pos - at);
      if (op == '.') return std::nullopt;
    }
    return in_.size();
  }

  // Follows one opcode; false when it is malformed here (LibTorch's unpickler trusts the stream:
  // a REDUCE on an empty stack or an odd SETITEMS crashes it) or uses the OrderedDict class in a
  // way this rewrite does not follow.
  bool step(unsigned char op, size_t at, size_t& pos) {
    const Entry other{Tag::kOther, at};
    switch (op) {
      case '.':  // STOP
        return stack_.size() == 1 && stack_.back().tag != Tag::kOrderedDictClass &&
               stack_.back().tag != Tag::kMark;
      case '(':
        stack_.push_back({Tag::kMark, at});
        return true;
      case ')': case '}': case ']':  // EMPTY_TUPLE, EMPTY_DICT, EMPTY_LIST
        stack_.push_back(container(Tag::kOther, at, 0));
        return true;
      case 'N': case 0x88: case 0x89:  // NONE, NEWTRUE, NEWFALSE
        stack_.push_back(other);
        return true;
      case 0x80: {  // PROTO; See Note [Integers and protocols LibTorch's unpickler does not read]
        uint64_t protocol = 0;
        if (!little_endian(pos, 1, protocol)) return false;
        if (protocol > 3)
          why_ = c10::str("is pickle protocol ", protocol, " (torch.save(..., pickle_protocol=", protocol,
                          ")), which LibTorch's unpickler does not read; save it with torch.save's default, "
                          "protocol 2");
        return why_.empty();
      }
      case 0x8a: {  // LONG1: widened to 8 bytes
        uint64_t length = 0;
        if (!little_endian(pos, 1, length) || length > in_.size() - pos) return false;
        if (length > 8) {
          why_ = c10::str("holds an integer of ", length, " bytes, beyond int64");
          return false;
        }
        std::string wide{'\x8a', '\x08'};
        const bool negative = length > 0 && (static_cast<unsigned char>(in_[pos + length - 1]) & 0x80) != 0;
        for (size_t i = 0; i < 8; ++i) wide.push_back(i < length ? in_[pos + i] : negative ? '\xff' : '\0');
        pos += length;
        if (length != 8) {
          rewritten_[at] = std::move(wide);
          changed_ = true;
        }
        stack_.push_back(other);
        return true;
      }
      case 'K': case 'M': case 'J': case 'G':  // BININT1, BININT2, BININT, BINFLOAT
        stack_.push_back(other);
        return skip(pos, op == 'K' ? 1 : op == 'M' ? 2 : op == 'J' ? 4 : 8);
      case 'U': case 'C': case 0x8c:             // 1-byte length: strings, bytes
      case 'T': case 'B': case 'X': case 0x8b:   // 4-byte length
      case 0x8d: case 0x8e: {                    // 8-byte length
        const size_t width = (op == 'U' || op == 'C' || op == 0x8c) ? 1
                             : (op == 0x8d || op == 0x8e)                         ? 8
                                                                                   : 4;
        uint64_t length = 0;
        stack_.push_back(other);
        return little_endian(pos, width, length) && skip(pos, length);
      }
      case 'c': {  // GLOBAL module\nname\n
        std::string module, name;
        if (!text_line(pos, module) || !text_line(pos, name)) return false;
        if (module == "collections" && name == "OrderedDict") {
          stack_.push_back({Tag::kOrderedDictClass, at});
          drop_.insert(at);
        } else {
          stack_.push_back(other);
        }
        return true;
      }
      case 'h': case 'j': {  // BINGET, LONG_BINGET
        uint64_t slot = 0;
        if (!little_endian(pos, op == 'h' ? 1 : 4, slot)) return false;
        const auto it = memo_.find(slot);
        if (it == memo_.end() || dropped(it->second.defined_at)) return false;
        stack_.push_back({it->second.tag, at, it->second.id});
        if (it->second.tag == Tag::kOrderedDictClass) drop_.insert(at);
        return true;
      }
      case 'q': case 'r': {  // BINPUT, LONG_BINPUT
        uint64_t slot = 0;
        if (!little_endian(pos, op == 'q' ? 1 : 4, slot) || stack_.empty() || stack_.back().tag == Tag::kMark)
          return false;
        // Pickle numbers memo slots 0, 1, 2, ... as it fills them; LibTorch's unpickler grows its
        // memo table to the slot, so LONG_BINPUT 2^31 would allocate 32 GB (a fuzzer-found hang).
        if (slot > ops_.size()) return false;
        memo_[slot] = {stack_.back().tag, at, stack_.back().id};
        if (stack_.back().tag == Tag::kOrderedDictClass) drop_.insert(at);
        return true;
      }
      case 'Q':  // BINPERSID
        return reduce_to_one(1, at);
      case 'R': {  // REDUCE: callable, args -> result
        if (stack_.size() < 2) return false;
        const Entry callable = stack_[stack_.size() - 2];
        const Entry args = stack_.back();
        if (callable.tag != Tag::kOrderedDictClass) return reduce_to_one(2, at);
        // Only OrderedDict() with no arguments, as pickle writes it, becomes a dict.
        if (ops_.empty() || ops_.back().first != args.start || in_[args.start] != ')') return false;
        replace_[args.start] = '}';
        drop_.insert(at);
        stack_.resize(stack_.size() - 2);
        stack_.push_back(container(Tag::kOrderedDict, callable.start, 0));
        changed_ = true;
        return true;
      }
      case 'b': {  // BUILD: object, state -> object
        if (stack_.size() < 2 || stack_.back().tag == Tag::kMark) return false;
        const Entry state = stack_.back();
        stack_.pop_back();
        if (stack_.back().tag == Tag::kOrderedDict) {
          dropped_ranges_.emplace_back(state.start, at);
        } else if (stack_.back().tag != Tag::kOther) {
          return false;
        }
        return nest(stack_.back(), depth(state));
      }
      case 'a': {  // APPEND
        if (stack_.size() < 2) return false;
        mark_before_.insert(stack_.back().start);
        replace_[at] = 'e';  // APPENDS
        changed_ = true;
        return nest(stack_[stack_.size() - 2], depth(stack_.back())) && pop(1);
      }
      case 's': {  // SETITEM
        if (stack_.size() < 3) return false;
        mark_before_.insert(stack_[stack_.size() - 2].start);
        replace_[at] = 'u';  // SETITEMS
        changed_ = true;
        return nest(stack_[stack_.size() - 3], std::max(depth(stack_.back()), depth(stack_[stack_.size() - 2]))) &&
               pop(2);
      }
      case 0x81:  // NEWOBJ
        return reduce_to_one(2, at);
      case 0x85: case 0x86: case 0x87:  // TUPLE1..3
        return reduce_to_one(op - 0x84, at);
      case 'e': case 'u': {  // APPENDS, SETITEMS: into the container below the mark
        size_t items = 0;
        uint32_t deepest = 0;
        if (!pop_to_mark(items, deepest) || stack_.empty() || stack_.back().tag == Tag::kMark) return false;
        return (op == 'e' || items % 2 == 0) && nest(stack_.back(), deepest);
      }
      case 't': case 'd': case 'l': {  // TUPLE, DICT, LIST
        size_t items = 0;
        uint32_t deepest = 0;
        const std::optional<size_t> mark = pop_to_mark(items, deepest);
        if (!mark || (op == 'd' && items % 2 != 0)) return false;
        stack_.push_back(container(Tag::kOther, *mark, deepest));
        too_deep_ = depth(stack_.back()) > kMaxNesting;
        return !too_deep_;
      }
      default:
        return false;
    }
  }

  bool reduce_to_one(size_t n, size_t at) {
    if (stack_.size() < n) return false;
    size_t start = at;
    uint32_t deepest = 0;
    for (size_t i = 0; i < n; ++i) {
      const Entry e = stack_.back();
      if (e.tag == Tag::kMark || e.tag == Tag::kOrderedDictClass) return false;
      start = std::min(start, e.start);
      deepest = std::max(deepest, depth(e));
      stack_.pop_back();
    }
    stack_.push_back(container(Tag::kOther, start, deepest));
    too_deep_ = depth(stack_.back()) > kMaxNesting;
    return !too_deep_;
  }
  bool pop(size_t n) {
    if (stack_.size() < n) return false;
    for (size_t i = 0; i < n; ++i) {
      if (stack_.back().tag == Tag::kMark || stack_.back().tag == Tag::kOrderedDictClass) return false;
      stack_.pop_back();
    }
    return true;
  }
  // Pops down to and including the innermost mark; returns the mark's offset.
  std::optional<size_t> pop_to_mark(size_t& items, uint32_t& deepest) {
    items = 0;
    deepest = 0;
    while (!stack_.empty() && stack_.back().tag != Tag::kMark) {
      if (stack_.back().tag == Tag::kOrderedDictClass) return std::nullopt;
      deepest = std::max(deepest, depth(stack_.back()));
      stack_.pop_back();
      ++items;
    }
    if (stack_.empty()) return std::nullopt;
    const size_t mark = stack_.back().start;
    stack_.pop_back();
    return mark;
  }
  bool skip(size_t& pos, uint64_t n) const {
    if (n > in_.size() - pos) return false;
    pos += static_cast<size_t>(n);
    return true;
  }
  bool little_endian(size_t& pos, size_t width, uint64_t& value) const {
    if (width > in_.size() - pos) return false;
    value = 0;
    for (size_t i = 0; i < width; ++i) value |= uint64_t{static_cast<unsigned char>(in_[pos + i])} << (8 * i);
    pos += width;
    return true;
  }
  bool text_line(size_t& pos, std::string& line) const {
    const auto begin = in_.begin() + static_cast<std::ptrdiff_t>(pos);
    const auto end = std::find(begin, in_.end(), '\n');
    if (end == in_.end()) return false;
    line.assign(begin, end);
    pos = static_cast<size_t>(end - in_.begin()) + 1;
    return true;
  }

  std::vector<char> in_;
  std::vector<Entry> stack_;
  std::unordered_map<uint64_t, Memo> memo_;
  std::vector<std::pair<size_t, size_t>> ops_;  // (offset, size) of every opcode with its argument
  std::set<size_t> drop_;                       // offsets of opcodes left out
  std::map<size_t, char> replace_;              // offsets of opcodes replaced by one byte
  std::map<size_t, std::string> rewritten_;     // offsets of opcodes replaced, argument and all
  std::string why_;                             // what the walker refuses, when it is not malformed
  std::set<size_t> mark_before_;                // offsets before which a MARK goes
  std::vector<std::pair<size_t, size_t>> dropped_ranges_;  // [first, last] opcode offsets left out
  std::vector<uint32_t> depth_{0};  // by Entry::id; id 0 stands for every scalar and string
  bool too_deep_ = false;
  bool changed_ = false;
};

}  // namespace

std::vector<char> check_and_rewrite_pickle(std::vector<char> pickle) {
  return OrderedDictRewriter(std::move(pickle)).run();
}

}  // namespace lockstep::detail
