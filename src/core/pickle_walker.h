#pragma once
// The pickle walker behind detail::check_and_rewrite_pickle (include/lockstep/core/torch_load.h):
// it follows every opcode of data.pkl before LibTorch's unpickler, which trusts the stream, and
// rewrites what that unpickler does not read. Its methods live in two files by concern:
// pickle_rewriter.cpp (the walk, containers, OrderedDict, the output) and pickle_protocols.cpp
// (protocols 3-5, strings, numbers, the memo and storages' persistent ids).

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lockstep/core/torch_load.h"

namespace lockstep::detail {

class PickleWalker {
 public:
  explicit PickleWalker(std::vector<char> bytes) : in_(std::move(bytes)) {}

  // The rewritten pickle and its storages; throws c10::Error naming the byte, the opcode and the
  // protocol of what it refuses.
  CheckedPickle run() &&;

 private:
  enum class Tag : uint8_t { kMark, kOther, kOrderedDictClass, kOrderedDict };
  // What the walker knows of a scalar value, for STACK_GLOBAL, the memo and persistent ids.
  enum class Kind : uint8_t { kNone, kString, kGlobal, kInt };
  struct Entry {  // 24 bytes: a hostile pickle can hold one per byte on the stack
    Entry() = default;
    Entry(Tag tag, size_t start, uint32_t id = 0, Kind kind = Kind::kNone, uint64_t a = 0, bool memoized = false)
        : start(start), a(a), id(id), tag(tag), kind(kind), memoized(memoized) {}
    size_t start = 0;  // offset of the first opcode that built this value
    uint64_t a = 0;    // kString: index into texts_; kGlobal: index of its module in texts_ (the
                       // name follows); kInt: the value's bits
    uint32_t id = 0;   // index into depth_ of a container; 0 for scalars and strings
    Tag tag = Tag::kMark;
    Kind kind = Kind::kNone;
    bool memoized = false;  // in the memo already: pickle memoizes a value once
  };
  struct Memo {  // a memoized value: the Entry memo_get pushes again, less its start
    uint64_t a = 0;
    size_t defined_at = 0;  // offset of the BINPUT or MEMOIZE
    uint32_t id = 0;
    Tag tag = Tag::kMark;
    Kind kind = Kind::kNone;
    bool defined = false;
  };
  struct Text {  // bytes of in_
    size_t at;
    size_t size;
  };
  // How the output writes an opcode of the input.
  enum class Action : uint8_t {
    kCopy,     // as it is
    kDrop,     // not at all
    kReplace,  // as the one byte Op::byte
    kProto2,   // PROTO 2
    kWiden,    // LONG1 of 8 bytes, sign-extended
    kUnicode,  // SHORT_BINUNICODE as BINUNICODE
    kMemoize,  // MEMOIZE as BINPUT / LONG_BINPUT of slot Op::arg
    kGlobal,   // STACK_GLOBAL as GLOBAL of texts_[Op::arg] and texts_[Op::arg + 1]
    kString,   // BINGET of a string left out, as BINUNICODE of texts_[Op::arg]
  };
  struct Op {     // 16 bytes: a hostile pickle holds one per byte
    size_t at;    // offset in in_; the opcode ends where the next begins
    uint32_t arg = 0;
    Action action = Action::kCopy;
    bool mark_before = false;  // a MARK is written before it
    char byte = 0;
  };

  // pickle_rewriter.cpp
  std::optional<size_t> walk();
  bool step(unsigned char op, size_t at, size_t& pos);
  bool containers(unsigned char op, size_t at);
  bool reduce(size_t at);
  bool build(size_t at);
  std::vector<char> output() const;
  Entry container(Tag tag, size_t start, uint32_t child_depth);
  uint32_t depth(const Entry& e) const { return depth_[e.id]; }
  bool nest(Entry& e, uint32_t child_depth);
  bool reduce_to_one(size_t n, size_t at);
  bool pop(size_t n);
  std::optional<size_t> pop_to_mark(size_t& items, uint32_t& deepest, std::vector<Entry>* popped = nullptr);
  Op& op_at(size_t offset);
  void drop_range(size_t first, size_t last);
  bool in_dropped_range(size_t at) const;
  bool left_out(size_t at);
  bool skip(size_t& pos, uint64_t n) const;
  bool little_endian(size_t& pos, size_t width, uint64_t& value) const;
  bool text_line(size_t& pos, Text& line) const;

  // pickle_protocols.cpp
  bool proto(size_t at, size_t& pos);
  bool frame(size_t at, size_t& pos);
  bool string(unsigned char op, size_t at, size_t& pos);
  bool integer(unsigned char op, size_t at, size_t& pos);
  bool global(size_t at, size_t& pos);
  bool stack_global(size_t at);
  bool push_global(Text module, Text name, size_t at);
  bool memo_put(unsigned char op, size_t at, size_t& pos);
  bool memo_get(unsigned char op, size_t at, size_t& pos);
  void remember_persistent_id(std::vector<Entry> items, uint32_t tuple_id);
  bool claim_storage(const Entry& persistent_id);
  bool unsupported(unsigned char op);
  void write(std::vector<char>& out, const Op& op, size_t size) const;
  void write_string(std::vector<char>& out, const Text& t) const;
  std::string text(const Text& t) const { return std::string(in_.data() + t.at, t.size); }
  std::string text(const Entry& e) const { return text(texts_[e.a]); }
  uint64_t add_text(Text t);

  std::vector<char> in_;
  std::optional<uint64_t> protocol_;  // from PROTO
  std::deque<Entry> stack_;
  std::deque<Memo> memo_;             // by slot (a deque: no copy of it all as it grows)
  size_t memo_count_ = 0;             // slots defined: len(memo), the slot MEMOIZE fills
  std::deque<Op> ops_;                // every opcode read, in order of offset
  size_t end_ = 0;                    // offset after the last opcode read
  std::vector<Text> texts_;           // strings and globals' names the walker needs again
  std::map<size_t, size_t> dropped_;  // [first, last] offsets of opcodes left out, disjoint
  // Tuples ('storage', ...) of five values, by container id: persistent ids, once BINPERSID uses them.
  std::unordered_map<uint32_t, std::array<Entry, 5>> persistent_ids_;
  std::vector<StorageClaim> storages_;
  std::set<std::pair<std::string, uint64_t>> claimed_;  // (key, bytes) in storages_
  std::vector<uint32_t> depth_{0};  // by Entry::id; id 0 stands for every scalar and string
  std::string why_;                 // what the walker refuses, when it is not malformed
  bool too_deep_ = false;
  bool changed_ = false;
};

}  // namespace lockstep::detail
