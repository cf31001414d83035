#include <c10/util/Exception.h>

#include <algorithm>

#include "pickle_opcodes.h"
#include "pickle_walker.h"

namespace lockstep::detail {

// Note [OrderedDict in LibTorch's unpickler]
// Python's model.state_dict() is a collections.OrderedDict carrying a `_metadata` attribute (each
// module's serialization version). torch.save pickles it (protocol 2) as
//   GLOBAL 'collections OrderedDict', EMPTY_TUPLE, REDUCE, MARK, key, tensor, ..., SETITEMS,
//   {'_metadata': OrderedDict(...)}, BUILD
// LibTorch's unpickler (1.13 and 2.14 alike) expects OrderedDict only as a tensor's (ignored)
// backward hooks: every OrderedDict() becomes None, so the SETITEMS that follows fails ("Expected
// GenericDict but got None"). It runs BUILD like REDUCE (the dict taken for a function) and knows
// no POP; 1.13 knew neither SETITEM nor APPEND (2.14 does; the rewrite below serves both). So
// before unpickling, the opcodes are rewritten:
//   the OrderedDict class (its GLOBAL, and BINPUT/BINGET of it)  ->  nothing
//   OrderedDict() (EMPTY_TUPLE, REDUCE)                          ->  EMPTY_DICT
//   STATE BUILD on such a dict (the _metadata attribute)         ->  nothing
//   KEY VALUE SETITEM (a dict of one entry)                      ->  MARK KEY VALUE SETITEMS
//   VALUE APPEND (a list of one element)                         ->  MARK VALUE APPENDS
// A dict keeps insertion order as OrderedDict does; the module versions in _metadata are not
// needed (lockstep's modules have one layout each). A later BINGET of a string memoized inside
// _metadata (a checkpoint's own 'version' key is the same object) is written as the string; a
// stream that uses the class any other way, or later refers to another dropped value, is refused.
//
// Note [Pickle nesting depth]
// LibTorch builds and destroys nested lists, dicts and tuples recursively: a pickle of 200,000
// nested lists (600 kB) overflows the stack (found by fuzz/ state_dict). The walker tracks every
// container's nesting depth and refuses streams deeper than kMaxNesting; Python's own pickler
// stops near 1000 (its recursion limit), and a state dict or checkpoint is a few levels deep.
constexpr uint32_t kMaxNesting = 1000;

namespace {

// " (opcode 0x93 STACK_GLOBAL)" for the opcode at `at`.
std::string opcode_at(const std::vector<char>& in, size_t at) {
  if (at >= in.size()) return " (no STOP opcode)";
  const auto op = static_cast<unsigned char>(in[at]);
  const char* name = pickle_opcode_name(op);
  return c10::str(" (opcode 0x", std::hex, int(op), std::dec, name ? c10::str(" ", name) : ", no pickle opcode", ")");
}

}  // namespace

CheckedPickle PickleWalker::run() && {
  const std::optional<size_t> bad = walk();
  const size_t at = bad.value_or(0);
  const std::string pickle =
      protocol_ ? c10::str("its pickle (data.pkl, protocol ", *protocol_, ")") : std::string("its pickle (data.pkl)");
  TORCH_CHECK(!too_deep_, pickle, " nests containers more than ", kMaxNesting, " deep at byte ", at, " of ",
              in_.size());
  TORCH_CHECK(why_.empty(), pickle, " ", why_, " (byte ", at, " of ", in_.size(), ")");
  TORCH_CHECK(!bad, pickle, " is malformed at byte ", at, " of ", in_.size(), opcode_at(in_, at));
  std::vector<char> out = changed_ ? output() : std::move(in_);
  return {std::move(out), std::move(storages_)};
}

// The offset of the first opcode that is malformed or not one a state dict is written with; the
// end of the stream when it has no STOP; nullopt when the whole stream is sound.
std::optional<size_t> PickleWalker::walk() {
  if (!in_.empty() && static_cast<unsigned char>(in_[0]) != 0x80) {
    why_ = "does not start with a PROTO opcode, so it is pickle protocol 0 or 1 (torch.save(..., "
           "pickle_protocol=0 or 1)), which LibTorch's unpickler does not read; save it with torch.save's "
           "default, protocol 2";
    return 0;
  }
  size_t pos = 0;
  while (pos < in_.size()) {
    const size_t at = pos;
    const auto op = static_cast<unsigned char>(in_[pos++]);
    ops_.push_back({at});  // step() may set how the output writes it
    if (!step(op, at, pos)) return at;
    end_ = pos;
    if (op == '.') return std::nullopt;
  }
  return in_.size();
}

// Follows one opcode; false when it is malformed here (LibTorch's unpickler trusts the stream:
// a REDUCE on an empty stack or an odd SETITEMS crashes it), or is one this walker does not read.
bool PickleWalker::step(unsigned char op, size_t at, size_t& pos) {
  switch (op) {
    case '.':  // STOP
      return stack_.size() == 1 && stack_.back().tag != Tag::kOrderedDictClass && stack_.back().tag != Tag::kMark;
    case '(':  // MARK
      stack_.push_back({Tag::kMark, at});
      return true;
    case 'N': case 0x88: case 0x89:  // NONE, NEWTRUE, NEWFALSE
      stack_.push_back({Tag::kOther, at});
      return true;
    case 'G':  // BINFLOAT
      stack_.push_back({Tag::kOther, at});
      return skip(pos, 8);
    case 'K': case 'M': case 'J': case 0x8a:  // BININT1, BININT2, BININT, LONG1
      return integer(op, at, pos);
    case 'X': case 0x8c: case 0x8d:  // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
      return string(op, at, pos);
    case 'c':  // GLOBAL
      return global(at, pos);
    case 0x93:  // STACK_GLOBAL
      return stack_global(at);
    case 0x80:  // PROTO
      return proto(at, pos);
    case 0x95:  // FRAME
      return frame(at, pos);
    case 'q': case 'r': case 0x94:  // BINPUT, LONG_BINPUT, MEMOIZE
      return memo_put(op, at, pos);
    case 'h': case 'j':  // BINGET, LONG_BINGET
      return memo_get(op, at, pos);
    case 'Q':  // BINPERSID
      return !stack_.empty() && claim_storage(stack_.back()) && reduce_to_one(1, at);
    case 'R':
      return reduce(at);
    case 'b':
      return build(at);
    case 0x81:  // NEWOBJ
      return reduce_to_one(2, at);
    case 0x85: case 0x86: case 0x87:  // TUPLE1..3
      return reduce_to_one(op - 0x84, at);
    default:
      return containers(op, at);
  }
}

// The opcodes that make and fill lists, dicts and tuples.
bool PickleWalker::containers(unsigned char op, size_t at) {
  switch (op) {
    case ')': case '}': case ']':  // EMPTY_TUPLE, EMPTY_DICT, EMPTY_LIST
      stack_.push_back(container(Tag::kOther, at, 0));
      return true;
    case 'a': {  // APPEND -> MARK VALUE APPENDS
      if (stack_.size() < 2) return false;
      op_at(stack_.back().start).mark_before = true;
      ops_.back().action = Action::kReplace;
      ops_.back().byte = 'e';
      changed_ = true;
      return nest(stack_[stack_.size() - 2], depth(stack_.back())) && pop(1);
    }
    case 's': {  // SETITEM -> MARK KEY VALUE SETITEMS
      if (stack_.size() < 3) return false;
      op_at(stack_[stack_.size() - 2].start).mark_before = true;
      ops_.back().action = Action::kReplace;
      ops_.back().byte = 'u';
      changed_ = true;
      return nest(stack_[stack_.size() - 3], std::max(depth(stack_.back()), depth(stack_[stack_.size() - 2]))) &&
             pop(2);
    }
    case 'e': case 'u': {  // APPENDS, SETITEMS: into the container below the mark
      size_t items = 0;
      uint32_t deepest = 0;
      if (!pop_to_mark(items, deepest) || stack_.empty() || stack_.back().tag == Tag::kMark) return false;
      return (op == 'e' || items % 2 == 0) && nest(stack_.back(), deepest);
    }
    case 't': case 'd': case 'l': {  // TUPLE, DICT, LIST
      size_t items = 0;
      uint32_t deepest = 0;
      std::vector<Entry> popped;  // a tuple's last values, for remember_persistent_id
      const std::optional<size_t> mark = pop_to_mark(items, deepest, op == 't' ? &popped : nullptr);
      if (!mark || (op == 'd' && items % 2 != 0)) return false;
      stack_.push_back(container(Tag::kOther, *mark, deepest));
      too_deep_ = depth(stack_.back()) > kMaxNesting;
      if (op == 't' && items == 5) remember_persistent_id(std::move(popped), stack_.back().id);
      return !too_deep_;
    }
    default:
      return unsupported(op);
  }
}

bool PickleWalker::reduce(size_t at) {  // REDUCE: callable, args -> result
  if (stack_.size() < 2) return false;
  const Entry callable = stack_[stack_.size() - 2];
  const Entry args = stack_.back();
  if (callable.tag != Tag::kOrderedDictClass) return reduce_to_one(2, at);
  // Only OrderedDict() with no arguments, as pickle writes it, becomes a dict; a FRAME may come
  // between (protocol 4 frames end at any opcode).
  size_t before = ops_.size() - 2;
  while (before > 0 && static_cast<unsigned char>(in_[ops_[before].at]) == 0x95) --before;
  Op& previous = ops_[before];
  if (previous.at != args.start || in_[args.start] != ')') return false;
  previous.action = Action::kReplace;
  previous.byte = '}';
  ops_.back().action = Action::kDrop;
  stack_.resize(stack_.size() - 2);
  stack_.push_back(container(Tag::kOrderedDict, callable.start, 0));
  changed_ = true;
  return true;
}

bool PickleWalker::build(size_t at) {  // BUILD: object, state -> object
  if (stack_.size() < 2 || stack_.back().tag == Tag::kMark) return false;
  const Entry state = stack_.back();
  stack_.pop_back();
  if (stack_.back().tag == Tag::kOrderedDict) {
    drop_range(state.start, at);
    changed_ = true;
  } else if (stack_.back().tag != Tag::kOther) {
    return false;
  }
  return nest(stack_.back(), depth(state));
}

std::vector<char> PickleWalker::output() const {
  std::vector<char> out;
  out.reserve(in_.size() + 64);
  auto range = dropped_.begin();
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    while (range != dropped_.end() && range->second < op.at) ++range;
    if (range != dropped_.end() && range->first <= op.at) continue;
    if (op.mark_before) out.push_back('(');
    write(out, op, (i + 1 < ops_.size() ? ops_[i + 1].at : end_) - op.at);
  }
  return out;
}

// A new container, holding values `child_depth` deep. See Note [Pickle nesting depth].
PickleWalker::Entry PickleWalker::container(Tag tag, size_t start, uint32_t child_depth) {
  depth_.push_back(child_depth + 1);
  return {tag, start, static_cast<uint32_t>(depth_.size() - 1)};
}

// Records that `e` (on the stack) now holds a value `child_depth` deep; false when too deep.
bool PickleWalker::nest(Entry& e, uint32_t child_depth) {
  if (e.id == 0) e = container(e.tag, e.start, 0);
  depth_[e.id] = std::max(depth_[e.id], child_depth + 1);
  too_deep_ = depth_[e.id] > kMaxNesting;
  return !too_deep_;
}

bool PickleWalker::reduce_to_one(size_t n, size_t at) {
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

bool PickleWalker::pop(size_t n) {
  if (stack_.size() < n) return false;
  for (size_t i = 0; i < n; ++i) {
    if (stack_.back().tag == Tag::kMark || stack_.back().tag == Tag::kOrderedDictClass) return false;
    stack_.pop_back();
  }
  return true;
}

// Pops down to and including the innermost mark; returns the mark's offset. `popped`, when given,
// receives up to six of the values, the last first.
std::optional<size_t> PickleWalker::pop_to_mark(size_t& items, uint32_t& deepest, std::vector<Entry>* popped) {
  items = 0;
  deepest = 0;
  while (!stack_.empty() && stack_.back().tag != Tag::kMark) {
    if (stack_.back().tag == Tag::kOrderedDictClass) return std::nullopt;
    deepest = std::max(deepest, depth(stack_.back()));
    if (popped != nullptr && popped->size() < 6) popped->push_back(stack_.back());
    stack_.pop_back();
    ++items;
  }
  if (stack_.empty()) return std::nullopt;
  const size_t mark = stack_.back().start;
  stack_.pop_back();
  return mark;
}

// The opcode read at `offset` (every Entry::start is one).
PickleWalker::Op& PickleWalker::op_at(size_t offset) {
  const auto it =
      std::lower_bound(ops_.begin(), ops_.end(), offset, [](const Op& op, size_t o) { return op.at < o; });
  TORCH_INTERNAL_ASSERT(it != ops_.end() && it->at == offset, "no opcode at byte ", offset, " of the pickle");
  return *it;
}

// Ranges are left out whole; a new one can only hold earlier ones (a value's opcodes are
// contiguous), so dropped_ stays disjoint.
void PickleWalker::drop_range(size_t first, size_t last) {
  auto it = dropped_.lower_bound(first);
  while (it != dropped_.end() && it->first <= last) it = dropped_.erase(it);
  dropped_[first] = last;
}

bool PickleWalker::in_dropped_range(size_t at) const {
  auto it = dropped_.upper_bound(at);
  if (it == dropped_.begin()) return false;
  --it;
  return at <= it->second;
}

// Whether the opcode at `at` is not written out.
bool PickleWalker::left_out(size_t at) { return in_dropped_range(at) || op_at(at).action == Action::kDrop; }

bool PickleWalker::skip(size_t& pos, uint64_t n) const {
  if (n > in_.size() - pos) return false;
  pos += static_cast<size_t>(n);
  return true;
}

bool PickleWalker::little_endian(size_t& pos, size_t width, uint64_t& value) const {
  if (width > in_.size() - pos) return false;
  value = 0;
  for (size_t i = 0; i < width; ++i) value |= uint64_t{static_cast<unsigned char>(in_[pos + i])} << (8 * i);
  pos += width;
  return true;
}

bool PickleWalker::text_line(size_t& pos, Text& line) const {
  const auto begin = in_.begin() + static_cast<std::ptrdiff_t>(pos);
  const auto end = std::find(begin, in_.end(), '\n');
  if (end == in_.end()) return false;
  line = {pos, static_cast<size_t>(end - begin)};
  pos = static_cast<size_t>(end - in_.begin()) + 1;
  return true;
}

CheckedPickle check_and_rewrite_pickle(std::vector<char> pickle) { return PickleWalker(std::move(pickle)).run(); }

}  // namespace lockstep::detail
