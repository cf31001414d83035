#include "lockstep/core/torch_load.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <map>

// Note [Reading Python's pickles]
// LibTorch 1.13's unpickler (torch::pickle_load) knows only the opcodes its own pickler emits.
// Python's pickler (protocol 2, torch.save's default) also writes:
//   SETITEM  for a dict of one entry (Python's SGD state {"momentum_buffer": t}),
//   APPEND   for a list of one element (a single param group),
//   collections.OrderedDict() + BUILD({"_metadata": ...}) for model.state_dict(); LibTorch turns
//            the OrderedDict into None and then fails to add items to it.
// So data.pkl is rewritten before unpickling, to the same value in opcodes LibTorch reads:
//   SETITEM -> MARK inserted before the key, SETITEMS;  APPEND -> MARK before the value, APPENDS;
//   OrderedDict() (GLOBAL or GET of it, EMPTY_TUPLE, REDUCE) -> EMPTY_DICT;
//   BUILD on such a dict -> removed with the state it applies (the _metadata dict, which only
//   versions modules' load hooks). LibTorch has no POP either, hence the removal.
// Where a key or value starts is found by following the pickle's stack symbolically: each stack
// entry remembers the byte where it began to be built; the memo (PUT/GET) carries the OrderedDict
// marks to later references. Tensors' backward-hook OrderedDicts become {} and are ignored, as None was.

namespace lockstep {
namespace {

struct Item {
  size_t start = 0;               // first byte of the opcodes that build this entry
  bool ordered_dict_class = false;  // collections.OrderedDict itself
  bool ordered_dict = false;        // an instance made by calling it
};

class PickleRewriter {
 public:
  PickleRewriter(const std::string& in, const std::string& source) : in_(in), source_(source) {}

  std::string run() {
    while (true) {
      const size_t pos = at_;
      const unsigned char op = byte();
      if (op == '.') break;  // STOP
      step(op, pos);
    }
    std::string out;
    out.reserve(in_.size() + inserts_.size());
    for (size_t i = 0; i < in_.size();) {
      auto ins = inserts_.find(i);
      if (ins != inserts_.end()) out += ins->second;
      auto rep = replacements_.find(i);
      if (rep != replacements_.end()) {
        out += rep->second.second;
        i = rep->second.first;
      } else {
        out += in_[i++];
      }
    }
    return out;
  }

 private:
  unsigned char byte() {
    TORCH_CHECK(at_ < in_.size(), source_, ": the pickle ends early (no STOP opcode)");
    return static_cast<unsigned char>(in_[at_++]);
  }
  uint32_t little_endian(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint32_t>(byte()) << (8 * i);
    return v;
  }
  std::string line() {
    const size_t end = in_.find('\n', at_);
    TORCH_CHECK(end != std::string::npos, source_, ": the pickle ends inside a text argument");
    std::string s = in_.substr(at_, end - at_);
    at_ = end + 1;
    return s;
  }
  void skip(size_t n) {
    TORCH_CHECK(at_ + n <= in_.size(), source_, ": the pickle ends inside an argument");
    at_ += n;
  }
  Item pop() {
    TORCH_CHECK(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back().first), source_,
                ": malformed pickle (pop from an empty stack at byte ", at_, ")");
    Item item = stack_.back();
    stack_.pop_back();
    return item;
  }
  size_t pop_to_mark() {
    TORCH_CHECK(!marks_.empty(), source_, ": malformed pickle (no MARK at byte ", at_, ")");
    const auto [size, mark_pos] = marks_.back();
    marks_.pop_back();
    stack_.resize(size);
    return mark_pos;
  }
  // Bytes [begin, end) become `text`; earlier edits inside them go.
  void replace(size_t begin, size_t end, std::string text) {
    inserts_.erase(inserts_.upper_bound(begin), inserts_.lower_bound(end));
    replacements_.erase(replacements_.lower_bound(begin), replacements_.lower_bound(end));
    replacements_[begin] = {end, std::move(text)};
  }
  void push(size_t start) { stack_.push_back(Item{start}); }
  void memo_get(const std::string& index, size_t pos) {
    auto it = memo_.find(index);
    Item item = it == memo_.end() ? Item{} : it->second;
    item.start = pos;
    stack_.push_back(item);
  }

  void step(unsigned char op, size_t pos) {
    switch (op) {
      case 0x80: skip(1); break;                                         // PROTO
      case '(': marks_.emplace_back(stack_.size(), pos); break;          // MARK
      case '0': pop(); break;                                            // POP
      case '1': pop_to_mark(); break;                                    // POP_MARK
      case '2': stack_.push_back(Item{pos}); break;                      // DUP
      case 'N': case 0x88: case 0x89: case ')': case ']': case '}': push(pos); break;
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'P': line(); push(pos); break;
      case 'g': memo_get(line(), pos); break;                            // GET
      case 'h': memo_get(std::to_string(little_endian(1)), pos); break;  // BINGET
      case 'j': memo_get(std::to_string(little_endian(4)), pos); break;  // LONG_BINGET
      case 'p': memo_[line()] = stack_.back(); break;                    // PUT
      case 'q': memo_[std::to_string(little_endian(1))] = stack_.back(); break;
      case 'r': memo_[std::to_string(little_endian(4))] = stack_.back(); break;
      case 'c': {                                                        // GLOBAL
        const std::string module = line(), name = line();
        Item item{pos};
        item.ordered_dict_class = module == "collections" && name == "OrderedDict";
        stack_.push_back(item);
        break;
      }
      case 'J': skip(4); push(pos); break;
      case 'K': skip(1); push(pos); break;
      case 'M': skip(2); push(pos); break;
      case 'G': skip(8); push(pos); break;
      case 'T': case 'X': case 'B': skip(little_endian(4)); push(pos); break;
      case 'U': case 'C': case 0x8c: skip(little_endian(1)); push(pos); break;
      case 0x8a: skip(little_endian(1)); push(pos); break;              // LONG1
      case 0x8b: skip(little_endian(4)); push(pos); break;              // LONG4
      case 't': case 'l': case 'd': push(pop_to_mark()); break;         // TUPLE, LIST, DICT
      case 0x85: { const Item a = pop(); push(a.start); break; }       // TUPLE1
      case 0x86: { pop(); const Item a = pop(); push(a.start); break; }
      case 0x87: { pop(); pop(); const Item a = pop(); push(a.start); break; }
      case 'Q': { const Item a = pop(); push(a.start); break; }        // BINPERSID
      case 0x81: { pop(); const Item cls = pop(); push(cls.start); break; }  // NEWOBJ
      case 'R': {                                                        // REDUCE
        const Item args = pop();
        const Item callable = pop();
        Item result{callable.start};
        if (callable.ordered_dict_class) {
          TORCH_CHECK(args.start + 1 == pos && in_[args.start] == ')', source_,
                      ": an OrderedDict built from arguments at byte ", pos, " (Python's pickler writes none)");
          replace(callable.start, pos + 1, "}");
          result.ordered_dict = true;
        }
        stack_.push_back(result);
        break;
      }
      case 'b': {                                                        // BUILD
        const Item state = pop();
        TORCH_CHECK(!stack_.empty(), source_, ": malformed pickle (BUILD without an object)");
        if (stack_.back().ordered_dict) replace(state.start, pos + 1, "");
        break;
      }
      case 'a': {                                                        // APPEND
        const Item value = pop();
        inserts_[value.start] += "(";
        replace(pos, pos + 1, "e");
        break;
      }
      case 's': {                                                        // SETITEM
        pop();
        const Item key = pop();
        inserts_[key.start] += "(";
        replace(pos, pos + 1, "u");
        break;
      }
      case 'e': case 'u': pop_to_mark(); break;                          // APPENDS, SETITEMS
      default:
        TORCH_CHECK(false, source_, ": unsupported pickle opcode 0x", std::hex, static_cast<int>(op), std::dec,
                    " at byte ", pos, " (lockstep reads torch.save's protocol 2)");
    }
  }

  const std::string& in_;
  const std::string& source_;
  size_t at_ = 0;
  std::vector<Item> stack_;
  std::vector<std::pair<size_t, size_t>> marks_;  // (stack size, byte) of each open MARK
  std::map<std::string, Item> memo_;
  std::map<size_t, std::string> inserts_;       // byte -> opcodes to insert before it
  std::map<size_t, std::pair<size_t, std::string>> replacements_;  // begin -> (end, what replaces the bytes)
};

}  // namespace

// See Note [Reading Python's pickles].
c10::IValue torch_load(const std::vector<char>& bytes, const std::string& source) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    const auto [data, size] = reader.getRecord("data.pkl");
    const std::string pickle =
        PickleRewriter(std::string(static_cast<const char*>(data.get()), size), source).run();
    size_t offset = 0;
    torch::jit::Unpickler unpickler(
        [&](char* buffer, size_t n) {
          n = std::min(n, pickle.size() - offset);
          std::memcpy(buffer, pickle.data() + offset, n);
          offset += n;
          return n;
        },
        /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
        [&](const std::string& name) { return std::get<0>(reader.getRecord("data/" + name)); }, c10::nullopt);
    unpickler.set_version(reader.version());
    return unpickler.parse_ivalue();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot read ", source, ": ", e.what_without_backtrace());
  }
}

}  // namespace lockstep
