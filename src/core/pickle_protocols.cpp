#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

#include "pickle_opcodes.h"
#include "pickle_walker.h"

namespace lockstep::detail {

// Note [Pickle protocols 3, 4 and 5]
// torch.save(..., pickle_protocol=3, 4 or 5) writes a state dict or checkpoint with the values of
// protocol 2 and opcodes LibTorch 2.14's unpickler does not read: it takes PROTO 2 only ("Only
// Pickle protocol 2 is supported") and, of what protocols 3-5 add, only BINUNICODE8 (each opcode
// fed to torch._C._pickle_load_obj, LibTorch's reader, from Python 2.14.1). The walker rewrites:
//   PROTO 3, 4 or 5                      ->  PROTO 2
//   FRAME n (the length of what follows) ->  nothing
//   SHORT_BINUNICODE                     ->  BINUNICODE (a 4-byte length)
//   MEMOIZE                              ->  BINPUT / LONG_BINPUT of the slot it fills, len(memo)
//   module name STACK_GLOBAL             ->  GLOBAL 'module\nname\n', the two strings left out
// The strings STACK_GLOBAL takes are memoized and may be fetched again ('torch' returns as the
// module of the next storage class; a user's 'torch' string is the same object): a BINGET of a
// string whose definition is left out is written as the string itself. Everything else protocols
// 3-5 add (bytes, sets, NEWOBJ_EX, out-of-band buffers) LibTorch does not read either: refused
// naming the opcode and the protocol, as is a stream the walker cannot follow.
//
// Note [Integers LibTorch's unpickler does not read]
// Python pickles an int beyond BININT's 32 bits as LONG1 with as few bytes as hold it (5 for
// 5,000,000,000), and LibTorch's unpickler reads only 8-byte LONG1s ("Expected length to be 8, got
// 5"). The walker widens every LONG1 of 0-7 bytes to 8, sign-extended; one of more than 8 bytes does
// not fit int64 and is refused saying so.

namespace {

constexpr uint64_t kNewestProtocol = 5;  // pickle.HIGHEST_PROTOCOL of Python 3.8 to 3.14

bool is_string_or_memo(unsigned char op) {
  return op == 'X' || op == 0x8c || op == 0x8d || op == 'h' || op == 'j' || op == 'q' || op == 'r' || op == 0x94 ||
         op == 0x95;
}

void put_little_endian(std::vector<char>& out, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

// At most 64 characters of a value from the file, for messages.
std::string shown(const std::string& s) { return s.size() <= 64 ? s : s.substr(0, 64) + "..."; }

}  // namespace

bool PickleWalker::proto(size_t at, size_t& pos) {
  uint64_t protocol = 0;
  if (at != 0 || !little_endian(pos, 1, protocol)) return false;
  protocol_ = protocol;
  if (protocol > kNewestProtocol) {
    why_ = c10::str("is pickle protocol ", protocol, ", newer than any Python writes (", kNewestProtocol,
                    "); save it with torch.save's default, protocol 2");
    return false;
  }
  if (protocol != 2) {
    ops_.back().action = Action::kProto2;
    changed_ = true;
  }
  return true;
}

bool PickleWalker::frame(size_t /*at*/, size_t& pos) {  // FRAME: the length of the frame after it
  uint64_t length = 0;
  if (!little_endian(pos, 8, length)) return false;
  if (length > in_.size() - pos) {
    why_ = c10::str("has a FRAME of ", length, " bytes, past its end");
    return false;
  }
  ops_.back().action = Action::kDrop;
  changed_ = true;
  return true;
}

bool PickleWalker::string(unsigned char op, size_t at, size_t& pos) {  // BINUNICODE and its siblings
  const size_t width = op == 0x8c ? 1 : op == 'X' ? 4 : 8;
  uint64_t length = 0;
  if (!little_endian(pos, width, length) || length > in_.size() - pos) return false;
  const uint64_t text = add_text({pos, static_cast<size_t>(length)});
  pos += static_cast<size_t>(length);
  if (op == 0x8c) {
    ops_.back().action = Action::kUnicode;
    changed_ = true;
  }
  stack_.push_back({Tag::kOther, at, 0, Kind::kString, text});
  return true;
}

// BININT1, BININT2, BININT and LONG1; See Note [Integers LibTorch's unpickler does not read].
bool PickleWalker::integer(unsigned char op, size_t at, size_t& pos) {
  uint64_t bits = 0;
  if (op == 0x8a) {
    uint64_t length = 0;
    if (!little_endian(pos, 1, length) || length > in_.size() - pos) return false;
    if (length > 8) {
      why_ = c10::str("holds an integer of ", length, " bytes, beyond int64");
      return false;
    }
    const bool negative = length > 0 && (static_cast<unsigned char>(in_[pos + length - 1]) & 0x80) != 0;
    little_endian(pos, static_cast<size_t>(length), bits);
    if (negative && length < 8) bits |= ~uint64_t{0} << (8 * length);
    if (length != 8) {
      ops_.back().action = Action::kWiden;
      changed_ = true;
    }
  } else {
    if (!little_endian(pos, op == 'K' ? 1 : op == 'M' ? 2 : 4, bits)) return false;
    if (op == 'J') bits = static_cast<uint64_t>(int64_t{static_cast<int32_t>(static_cast<uint32_t>(bits))});
  }
  stack_.push_back({Tag::kOther, at, 0, Kind::kInt, bits});
  return true;
}

bool PickleWalker::global(size_t at, size_t& pos) {  // GLOBAL module\nname\n
  Text module{}, name{};
  return text_line(pos, module) && text_line(pos, name) && push_global(module, name, at);
}

// STACK_GLOBAL: module, name -> the class they name. See Note [Pickle protocols 3, 4 and 5].
bool PickleWalker::stack_global(size_t at) {
  if (stack_.size() < 2 || stack_.back().kind != Kind::kString || stack_[stack_.size() - 2].kind != Kind::kString) {
    why_ = "has a STACK_GLOBAL that does not follow two strings (a module and a name)";
    return false;
  }
  const Entry module = stack_[stack_.size() - 2], name = stack_.back();
  if (text(module).find('\n') != std::string::npos || text(name).find('\n') != std::string::npos) {
    why_ = "has a STACK_GLOBAL naming a module or class with a newline";
    return false;
  }
  // Between the module's string and here there is nothing but the name's and memo opcodes (no
  // other opcode leaves the stack as it found it): all are left out.
  for (size_t i = ops_.size() - 1; i-- > 0 && ops_[i].at >= module.start;) {
    if (!is_string_or_memo(static_cast<unsigned char>(in_[ops_[i].at]))) return false;
    ops_[i].action = Action::kDrop;
  }
  stack_.resize(stack_.size() - 2);
  changed_ = true;
  if (!push_global(texts_[module.a], texts_[name.a], at)) return false;
  if (stack_.back().tag == Tag::kOrderedDictClass) return true;
  if (stack_.back().a >= std::numeric_limits<uint32_t>::max()) return false;
  ops_.back().action = Action::kGlobal;
  ops_.back().arg = static_cast<uint32_t>(stack_.back().a);
  return true;
}

// Pushes the class module.name, read by the GLOBAL or STACK_GLOBAL at `at`; See Note [OrderedDict
// in LibTorch's unpickler] for collections.OrderedDict.
bool PickleWalker::push_global(Text module, Text name, size_t at) {
  if (text(module) == "collections" && text(name) == "OrderedDict") {
    stack_.push_back({Tag::kOrderedDictClass, at});
    ops_.back().action = Action::kDrop;
    changed_ = true;
    return true;
  }
  const uint64_t first = add_text(module);
  add_text(name);  // texts_[first + 1]
  stack_.push_back({Tag::kOther, at, 0, Kind::kGlobal, first});
  return true;
}

bool PickleWalker::memo_put(unsigned char op, size_t at, size_t& pos) {  // BINPUT, LONG_BINPUT, MEMOIZE
  uint64_t slot = memo_count_;  // MEMOIZE fills slot len(memo), as Python's unpickler does
  if (op != 0x94 && !little_endian(pos, op == 'q' ? 1 : 4, slot)) return false;
  // Python's and LibTorch's picklers memoize a value once, when it is made (a value fetched from
  // the memo is not put again): a stream of MEMOIZEs would otherwise cost a slot per byte.
  if (stack_.empty() || stack_.back().tag == Tag::kMark || stack_.back().memoized) return false;
  // Pickle numbers memo slots 0, 1, 2, ... as it fills them; LibTorch's unpickler grows its
  // memo table to the slot, so LONG_BINPUT 2^31 would allocate 32 GB (a fuzzer-found hang).
  if (slot > ops_.size() || slot >= std::numeric_limits<uint32_t>::max()) return false;
  if (slot >= memo_.size()) memo_.resize(static_cast<size_t>(slot) + 1);
  Memo& memo = memo_[static_cast<size_t>(slot)];
  memo_count_ += memo.defined ? 0 : 1;
  Entry& top = stack_.back();
  top.memoized = true;
  memo = {top.a, at, top.id, top.tag, top.kind, true};
  if (stack_.back().tag == Tag::kOrderedDictClass) {
    ops_.back().action = Action::kDrop;
    changed_ = true;
  } else if (op == 0x94) {
    ops_.back().action = Action::kMemoize;
    ops_.back().arg = static_cast<uint32_t>(slot);
    changed_ = true;
  }
  return true;
}

bool PickleWalker::memo_get(unsigned char op, size_t at, size_t& pos) {  // BINGET, LONG_BINGET
  uint64_t slot = 0;
  if (!little_endian(pos, op == 'h' ? 1 : 4, slot) || slot >= memo_.size() || !memo_[slot].defined) return false;
  const Memo& memo = memo_[static_cast<size_t>(slot)];
  const Entry value{memo.tag, at, memo.id, memo.kind, memo.a, /*memoized=*/true};
  if (value.tag == Tag::kOrderedDictClass) {
    ops_.back().action = Action::kDrop;
    changed_ = true;
  } else if (left_out(memo.defined_at)) {
    // A string left out is written here; any other value left out cannot be.
    if (value.kind != Kind::kString || value.a >= std::numeric_limits<uint32_t>::max()) return false;
    ops_.back().action = Action::kString;
    ops_.back().arg = static_cast<uint32_t>(value.a);
    changed_ = true;
  }
  stack_.push_back(value);
  return true;
}

// `items`: a 5-tuple's values, the last first. A tuple ('storage', ...) may be a persistent id.
void PickleWalker::remember_persistent_id(std::vector<Entry> items, uint32_t tuple_id) {
  if (items.size() != 5 || items.back().kind != Kind::kString || text(items.back()) != "storage") return;
  persistent_ids_[tuple_id] = {items[4], items[3], items[2], items[1], items[0]};
}

// BINPERSID of `persistent_id`: ('storage', torch.<type>Storage, key, location, numel), as
// torch.save and torch::pickle_save write a storage's, and the only kind LibTorch reads. See Note
// [Storage sizes come from the pickle] (torch_load.cpp) for what the claim is checked against.
bool PickleWalker::claim_storage(const Entry& persistent_id) {
  const auto it = persistent_id.id == 0 ? persistent_ids_.end() : persistent_ids_.find(persistent_id.id);
  const bool formed = it != persistent_ids_.end() && it->second[1].kind == Kind::kGlobal &&
                      it->second[2].kind == Kind::kString && it->second[3].kind == Kind::kString &&
                      it->second[4].kind == Kind::kInt;
  if (!formed) {
    why_ = "has a persistent id (BINPERSID) that is not ('storage', torch.<type>Storage, key, location, numel), "
           "as torch.save writes a storage's";
    return false;
  }
  const auto& [storage, type, key, location, numel] = it->second;
  const std::string module = text(texts_[type.a]), name = text(texts_[type.a + 1]);
  const std::optional<size_t> element = module == "torch" ? storage_element_size(name) : std::nullopt;
  if (!element) {
    why_ = c10::str("has a storage of class ", shown(module), ".", shown(name), ", which LibTorch's unpickler does "
                    "not read", module == "torch.storage" && name == "UntypedStorage"
                        ? "; torch.save writes one for tensors of dtypes LibTorch does not load (uint16, uint32, "
                          "uint64, float8, complex32): convert them before saving, e.g. with .to(torch.int32)"
                        : "");
    return false;
  }
  const auto count = static_cast<int64_t>(numel.a);
  uint64_t bytes = 0;
  if (count < 0 || __builtin_mul_overflow(static_cast<uint64_t>(count), *element, &bytes)) {
    why_ = c10::str("claims a storage of ", count, " elements of torch.", name, " for record data/", shown(text(key)));
    return false;
  }
  std::string record = text(key);
  if (claimed_.emplace(record, bytes).second) {
    storages_.push_back({std::move(record), name, static_cast<uint64_t>(count), bytes});
  }
  return true;
}

bool PickleWalker::unsupported(unsigned char op) {
  if (const char* name = pickle_opcode_name(op)) {
    why_ = c10::str("uses opcode 0x", std::hex, int(op), std::dec, " (", name, "), which LibTorch's unpickler does "
                    "not read (a state dict or checkpoint holds dicts, lists, tuples, strings, numbers and tensors)");
  }
  return false;
}

uint64_t PickleWalker::add_text(Text t) {
  texts_.push_back(t);
  return texts_.size() - 1;
}

// Op `op`, `size` bytes of in_, as the output holds it.
void PickleWalker::write(std::vector<char>& out, const Op& op, size_t size) const {
  const auto copy = [&](size_t at, size_t n) {
    out.insert(out.end(), in_.begin() + static_cast<std::ptrdiff_t>(at),
               in_.begin() + static_cast<std::ptrdiff_t>(at + n));
  };
  switch (op.action) {
    case Action::kCopy:
      return copy(op.at, size);
    case Action::kDrop:
      return;
    case Action::kReplace:
      out.push_back(op.byte);
      return;
    case Action::kProto2:
      out.insert(out.end(), {'\x80', '\x02'});
      return;
    case Action::kWiden: {  // LONG1 n bytes -> LONG1 8 bytes
      const size_t length = static_cast<unsigned char>(in_[op.at + 1]);
      const bool negative = length > 0 && (static_cast<unsigned char>(in_[op.at + 1 + length]) & 0x80) != 0;
      out.insert(out.end(), {'\x8a', '\x08'});
      for (size_t i = 0; i < 8; ++i) out.push_back(i < length ? in_[op.at + 2 + i] : negative ? '\xff' : '\0');
      return;
    }
    case Action::kUnicode:
      return write_string(out, {op.at + 2, size - 2});
    case Action::kMemoize:
      out.push_back(op.arg < 256 ? 'q' : 'r');
      return put_little_endian(out, op.arg, op.arg < 256 ? 1 : 4);
    case Action::kGlobal:
      out.push_back('c');
      copy(texts_[op.arg].at, texts_[op.arg].size);
      out.push_back('\n');
      copy(texts_[op.arg + 1].at, texts_[op.arg + 1].size);
      out.push_back('\n');
      return;
    case Action::kString:
      return write_string(out, texts_[op.arg]);
  }
}

// BINUNICODE, or BINUNICODE8 past 4 GB (both of which LibTorch reads).
void PickleWalker::write_string(std::vector<char>& out, const Text& t) const {
  const bool wide = t.size > std::numeric_limits<uint32_t>::max();
  out.push_back(wide ? '\x8d' : 'X');
  put_little_endian(out, t.size, wide ? 8 : 4);
  out.insert(out.end(), in_.begin() + static_cast<std::ptrdiff_t>(t.at),
             in_.begin() + static_cast<std::ptrdiff_t>(t.at + t.size));
}

}  // namespace lockstep::detail
