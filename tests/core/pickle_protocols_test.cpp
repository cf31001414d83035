// Issue 53 item 19: torch.save(..., pickle_protocol=4) files were called corrupt ("malformed at
// byte 2 (opcode 0x95)"), then refused naming the protocol. Protocols 3, 4 and 5 now load, as
// protocol 2 does: See Note [Pickle protocols 3, 4 and 5]. A stream the walker cannot follow is
// refused naming the opcode and the protocol, never handed to LibTorch's unpickler.

#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/process.h"
#include "lockstep/core/torch_load.h"
#include "lockstep/models/state_dict.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::string_literals;

// Writes, into argv[1], a checkpoint-like dict and a state dict with pickle_protocol 2 to 5
// (NAME_P.pt), each value as JSON, exactly (NAME.json), and the opcodes each file uses (NAME_P.ops).
constexpr const char* kWriteProtocols = R"PY(
import collections, json, pickletools, sys, zipfile, torch
out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.randn(5, 3)).sum().backward()
opt.step()
base = torch.arange(12, dtype=torch.float32)
dtypes = {torch.float32: 'Float', torch.float64: 'Double', torch.float16: 'Half', torch.bfloat16: 'BFloat16',
          torch.complex64: 'ComplexFloat', torch.complex128: 'ComplexDouble', torch.int8: 'Char',
          torch.uint8: 'Byte', torch.int16: 'Short', torch.int32: 'Int', torch.int64: 'Long', torch.bool: 'Bool'}
tensors = {name: (torch.randn(3, 2) * 100).to(dt) for dt, name in dtypes.items()}
checkpoint = {
    'model': model.state_dict(),
    'optimizer': opt.state_dict(),
    'version': 3,  # the very string object that _metadata's keys are
    'ints': [0, 1, 255, 256, 65535, 65536, 2**31 - 1, -2**31, 2**31, 5_000_000_000, -5_000_000_000,
             2**55, 2**63 - 1, -2**63],
    'names': ['layer', 'layer', 'torch', 'collections', 'OrderedDict', 'storage', 'cpu', 'x' * 300],
    'nested': {'a': {'b': [1, {'c': ('torch', 2.5)}]}, 'one': [collections.OrderedDict(k=1)]},
    'tensors': tensors,
    'view': base[2:8].view(2, 3), 'base': base, 'empty': torch.zeros(0, 3), 'scalar': torch.tensor(1.5),
    'flags': (True, False, None), 'floats': [0.1, -1e300, float('inf')],
}

def tree(v):  # the value as JSON, exactly: floats as hex, tensors as their bytes
    if isinstance(v, torch.Tensor):
        flat = v.detach().contiguous().reshape(-1).view(torch.uint8)
        return {'tensor': dtypes[v.dtype], 'shape': list(v.shape), 'bytes': flat.numpy().tobytes().hex()}
    if isinstance(v, dict):
        return {'dict': [[tree(k), tree(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return {'list' if isinstance(v, list) else 'tuple': [tree(x) for x in v]}
    if v is None or isinstance(v, bool):
        return {'bool': v} if v is not None else {'none': None}
    if isinstance(v, int):
        return {'int': v}
    if isinstance(v, float):
        return {'float': v.hex()}
    return {'str': v}

for name, value in (('checkpoint', checkpoint), ('state_dict', model.state_dict())):
    with open(f'{out}/{name}.json', 'w') as f:
        json.dump(tree(value), f)
    for protocol in (2, 3, 4, 5):
        path = f'{out}/{name}_{protocol}.pt'
        torch.save(value, path, pickle_protocol=protocol)
        z = zipfile.ZipFile(path)
        pickle = z.read(next(n for n in z.namelist() if n.endswith('/data.pkl')))
        with open(f'{out}/{name}_{protocol}.ops', 'w') as f:
            f.write(' '.join(sorted({op.name for op, _, _ in pickletools.genops(pickle)})))
torch.save({'t': torch.zeros(3, dtype=torch.uint16)}, f'{out}/uint16_4.pt', pickle_protocol=4)
)PY";

// A zip archive as torch.save writes it around `pickle`.
std::vector<char> archive(const std::string& pickle) {
  std::vector<char> bytes;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    bytes.insert(bytes.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  writer.writeEndOfFile();
  return bytes;
}

// Python and LibTorch memoize a value once; a stream of 20 M MEMOIZEs (20 MB) took 2.6 GB in the
// walker and LibTorch's unpickler (a memo slot per byte). A second put of one value is refused.
TEST(PickleProtocols, AValueMemoizedTwiceIsRefusedBeforeTheMemoGrows) {
  const double before = peak_rss_mib();
  const std::string memoizes = "\x80\x04N"s + std::string(20 << 20, '\x94') + ".";
  EXPECT_THAT(testing::error_message([&] { torch_load(archive(memoizes)); }),
              HasSubstr("its pickle (data.pkl, protocol 4) is malformed at byte 4 of 20971524 (opcode 0x94 MEMOIZE)"));
  EXPECT_LT(peak_rss_mib() - before, 200.0);  // the archive and its copies, ~80 MB
  EXPECT_THAT(testing::error_message([&] { torch_load(archive("\x80\x02Nq\x00h\x00q\x01\x86."s)); }),
              HasSubstr("its pickle (data.pkl, protocol 2) is malformed at byte 7 of 11 (opcode 0x71 BINPUT)"));
}

// Where `v` differs from `e`, a value as the script's tree() writes it; empty when they are equal.
std::string difference(const c10::IValue& v, const nlohmann::json& e, const std::string& at) {
  const auto differs = [&](const std::string& what) {
    return at + ": " + what + " where Python wrote " + e.dump().substr(0, 160);
  };
  if (e.contains("tensor")) {
    if (!v.isTensor()) return differs(c10::str("a ", v.tagKind()));
    const at::Tensor t = v.toTensor().contiguous();
    if (c10::toString(t.scalar_type()) != e["tensor"].get<std::string>() ||
        t.sizes().vec() != e["shape"].get<std::vector<int64_t>>())
      return differs(c10::str("a tensor of ", t.scalar_type(), " and shape ", t.sizes()));
    std::string hex;
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) {
      char two[3];
      std::snprintf(two, sizeof(two), "%02x", bytes[i]);
      hex += two;
    }
    return hex == e["bytes"].get<std::string>() ? "" : differs("other bytes (" + hex.substr(0, 64) + ")");
  }
  if (e.contains("dict")) {
    if (!v.isGenericDict() || v.toGenericDict().size() != e["dict"].size()) return differs(c10::str("a ", v.tagKind()));
    size_t i = 0;
    for (const auto& item : v.toGenericDict()) {  // in order: an OrderedDict's order is kept
      std::string diff = difference(item.key(), e["dict"][i][0], c10::str(at, "/key ", i));
      if (diff.empty()) diff = difference(item.value(), e["dict"][i][1], c10::str(at, "/", item.key()));
      if (!diff.empty()) return diff;
      ++i;
    }
    return "";
  }
  if (e.contains("list") || e.contains("tuple")) {
    const bool list = e.contains("list");
    const nlohmann::json& want = list ? e["list"] : e["tuple"];
    if (list ? !v.isList() : !v.isTuple()) return differs(c10::str("a ", v.tagKind()));
    const std::vector<c10::IValue> items = list ? v.toListRef().vec() : v.toTupleRef().elements().vec();
    if (items.size() != want.size()) return differs(c10::str(items.size(), " elements"));
    for (size_t i = 0; i < items.size(); ++i) {
      if (std::string diff = difference(items[i], want[i], c10::str(at, "[", i, "]")); !diff.empty()) return diff;
    }
    return "";
  }
  if (e.contains("int")) return v.isInt() && v.toInt() == e["int"].get<int64_t>() ? "" : differs(c10::str(v));
  if (e.contains("float")) {
    const double want = std::strtod(e["float"].get<std::string>().c_str(), nullptr);
    const double got = v.isDouble() ? v.toDouble() : 0.0;
    return v.isDouble() && std::memcmp(&got, &want, sizeof(double)) == 0 ? "" : differs(c10::str(v));
  }
  if (e.contains("bool")) return v.isBool() && v.toBool() == e["bool"].get<bool>() ? "" : differs(c10::str(v));
  if (e.contains("none")) return v.isNone() ? "" : differs(c10::str(v));
  return v.isString() && v.toStringRef() == e["str"].get<std::string>() ? "" : differs(c10::str(v));
}

TEST(PickleProtocols, CheckpointsAndStateDictsOfEveryProtocolLoadAsPythonWroteThem) {
  const std::string python = testing::python_with_torch();
  if (python.empty()) GTEST_SKIP() << testing::kNoPythonTorch;
  testing::TempDir dir;
  const std::string script = kWriteProtocols;
  std::ofstream(dir / "write.py") << script.substr(1);
  const auto r = testing::run_command(python + " '" + (dir / "write.py") + "' '" + dir.path() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The files use what protocol 4 adds, and memoized strings are fetched again (LONG_BINGET: more
  // than 256 memo slots).
  EXPECT_THAT(testing::read_text(dir / "checkpoint_4.ops"),
              AllOf(HasSubstr("FRAME"), HasSubstr("MEMOIZE"), HasSubstr("STACK_GLOBAL"), HasSubstr("SHORT_BINUNICODE"),
                    HasSubstr("BINGET"), HasSubstr("LONG_BINGET"), HasSubstr("LONG1")));
  for (const std::string name : {"checkpoint", "state_dict"}) {
    const nlohmann::json expected = nlohmann::json::parse(testing::read_text(dir / (name + ".json")));
    for (const int protocol : {2, 3, 4, 5}) {
      const std::string file = name + "_" + std::to_string(protocol) + ".pt";
      c10::IValue value;
      ASSERT_EQ(testing::error_message([&] { value = torch_load(read_file(dir / file)); }), "<no error>") << file;
      EXPECT_EQ(difference(value, expected, file), "");
    }
  }
  // Through a model, as --init-weights reads a file: protocol 4's state dict fills it with the
  // values protocol 2's holds.
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2));
  models::load_state_dict_file(*model, dir / "state_dict_4.pt");
  const auto two = torch_load(read_file(dir / "state_dict_2.pt")).toGenericDict();
  size_t compared = 0;
  for (const auto& named : {model->named_parameters(), model->named_buffers()}) {
    for (const auto& item : named) {
      EXPECT_TRUE(torch::equal(item.value(), two.at(item.key()).toTensor())) << item.key();
      ++compared;
    }
  }
  EXPECT_EQ(compared, two.size());
  // A dtype LibTorch does not read is named as such, not as a corrupt file.
  EXPECT_THAT(testing::error_message([&] { torch_load(read_file(dir / "uint16_4.pt")); }),
              HasSubstr("its pickle (data.pkl, protocol 4) has a storage of class torch.storage.UntypedStorage, "
                        "which LibTorch's unpickler does not read; torch.save writes one for tensors of dtypes"));
}

TEST(PickleProtocols, HostileStreamsAreRefusedNamingTheOpcodeAndTheProtocol) {
  struct Case {
    const char* what;
    std::string pickle;
    std::string message;
  };
  const std::string p4 = "its pickle (data.pkl, protocol 4) ";
  const std::vector<Case> cases = {
      {"STACK_GLOBAL of two ints", "\x80\x04K\x01K\x02\x93."s,
       p4 + "has a STACK_GLOBAL that does not follow two strings (a module and a name) (byte 6 of 8)"},
      {"STACK_GLOBAL of one string", "\x80\x04\x8c\x01" "a\x93."s, p4 + "has a STACK_GLOBAL that does not follow"},
      {"STACK_GLOBAL naming a newline", "\x80\x04\x8c\x02" "a\n\x8c\x01" "b\x93."s,
       p4 + "has a STACK_GLOBAL naming a module or class with a newline (byte 9 of 11)"},
      {"MEMOIZE on an empty stack", "\x80\x04\x94."s, p4 + "is malformed at byte 2 of 4 (opcode 0x94 MEMOIZE)"},
      {"MEMOIZE on a MARK", "\x80\x04(\x94K\x01t."s, p4 + "is malformed at byte 3 of 8 (opcode 0x94 MEMOIZE)"},
      {"a FRAME past the end", "\x80\x04\x95\x00\x10\x00\x00\x00\x00\x00\x00K\x01."s,
       p4 + "has a FRAME of 4096 bytes, past its end (byte 2 of 14)"},
      {"a FRAME cut short", "\x80\x04\x95\x01\x00"s, p4 + "is malformed at byte 2 of 5 (opcode 0x95 FRAME)"},
      {"a BINGET of no slot", "\x80\x04K\x01\x94h\x05."s, p4 + "is malformed at byte 5 of 8 (opcode 0x68 BINGET)"},
      {"a set", "\x80\x04\x8f."s, p4 + "uses opcode 0x8f (EMPTY_SET), which LibTorch's unpickler does not read"},
      {"a bytearray", "\x80\x05\x96\x01\x00\x00\x00\x00\x00\x00\x00x."s,
       "its pickle (data.pkl, protocol 5) uses opcode 0x96 (BYTEARRAY8)"},
      {"protocol 6", "\x80\x06K\x01."s, "is pickle protocol 6, newer than any Python writes (5)"},
      {"no PROTO", "K\x01."s, "does not start with a PROTO opcode, so it is pickle protocol 0 or 1"},
      {"a second PROTO", "\x80\x04\x80\x04K\x01."s, p4 + "is malformed at byte 2 of 7 (opcode 0x80 PROTO)"},
      {"a persistent id of ints", "\x80\x02(X\x07\x00\x00\x00storageK\x01K\x02K\x03K\x04tQ."s,
       "has a persistent id (BINPERSID) that is not ('storage', torch.<type>Storage, key, location, numel)"},
      {"a storage of -1 elements",
       "\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpu"
       "J\xff\xff\xff\xfftQ."s,
       "claims a storage of -1 elements of torch.FloatStorage for record data/0"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(testing::error_message([&] { torch_load(archive(c.pickle)); }), HasSubstr(c.message)) << c.what;
  }
  // What protocol 4 may do and the walker follows: a class named by STACK_GLOBAL, and a memoized
  // string of it fetched again after it was left out (written there as the string).
  const c10::IValue v = torch_load(archive(
      "\x80\x04\x8c\x05torch\x94\x8c\x06" "device\x94\x93\x94\x8c\x03" "cpu\x94\x85\x94R\x94h\x00\x86\x94."s));
  ASSERT_TRUE(v.isTuple()) << v.tagKind();
  EXPECT_EQ(v.toTupleRef().elements()[0].toDevice(), c10::Device("cpu"));
  EXPECT_EQ(v.toTupleRef().elements()[1].toStringRef(), "torch");
}

}  // namespace
}  // namespace lockstep
