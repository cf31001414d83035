#include "lockstep/core/torch_load.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "lockstep/core/zip_checksum.h"

namespace lockstep {
namespace {

// The zip archive's bytes as PyTorchStreamReader reads them, refusing reads past the end.
class BytesReadAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReadAdapter(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - static_cast<size_t>(pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

// Note [Storage sizes come from the pickle]
// LibTorch's unpickler sizes each storage from the pickle's persistent id ('storage', type, key,
// device, numel) and hands it the bytes of record data/KEY, without comparing the two. A flipped
// key (data/0 -> data/1, one bit) or numel gives a tensor whose storage claims more bytes than
// its record holds: the first copy of it reads past the buffer (a segfault for a model's weight,
// found by fuzz/ state_dict; fuzz/crashes/state_dict/). And a record larger than its storage is
// read whole for nothing (a 1.7 MB file whose data/0 inflates to 1 GB, issue 53). torch.save and
// LibTorch's writers make each record exactly its storage's bytes, numel x the element size, so
// the pickle walker collects every persistent id's claim and each claimed record's size, from the
// zip's directory, must equal it before any record is read. After unpickling, every tensor's
// shape, strides and offset are checked against its storage, and the storage against the record.
void check_records(caffe2::serialize::PyTorchStreamReader& reader, const std::vector<detail::StorageClaim>& claims) {
  for (const detail::StorageClaim& claim : claims) {
    const std::string record = "data/" + claim.key;
    const std::string shown = record.size() <= 64 ? record : record.substr(0, 64) + "...";
    TORCH_CHECK(reader.hasRecord(record), "the archive has no record ", shown, " for a tensor its pickle refers to");
    const size_t size = reader.getRecordSize(record);
    TORCH_CHECK(size == claim.bytes, "its pickle claims ", claim.bytes, " bytes for the storage in record ", shown,
                ", which holds ", size, " bytes; torch.save writes a storage's record with exactly its bytes (",
                claim.numel, " elements of torch.", claim.type, " here), so the file was cut, padded or edited: "
                "save it again with torch.save");
  }
}

class StorageChecker {
 public:
  // Records read so far, by the address of their bytes.
  void add(const at::DataPtr& data, const std::string& key, size_t bytes) {
    records_[data.get()] = {key, bytes};
  }

  // Throws c10::Error when a tensor anywhere in `value` claims more bytes than its record holds.
  void check(const c10::IValue& value) const {
    std::vector<c10::IValue> todo{value};
    std::set<const void*> seen;  // containers can be shared (memo) or, through the memo, cyclic
    while (!todo.empty()) {
      const c10::IValue v = std::move(todo.back());
      todo.pop_back();
      if (v.isTensor()) {
        check(v.toTensor());
      } else if (v.isGenericDict() || v.isList() || v.isTuple()) {
        if (!seen.insert(v.internalToPointer()).second) continue;
        if (v.isGenericDict()) {
          for (const auto& item : v.toGenericDict()) {
            todo.push_back(item.key());
            todo.push_back(item.value());
          }
        } else if (v.isList()) {
          for (const c10::IValue& e : v.toListRef()) todo.push_back(e);
        } else {
          for (const c10::IValue& e : v.toTupleRef().elements()) todo.push_back(e);
        }
      }
    }
  }

 private:
  void check(const at::Tensor& t) const {
    if (!t.defined() || !t.has_storage()) return;
    const c10::Storage& storage = t.storage();
    // The unpickler also sets sizes, strides and offset without checking them against the storage
    // (a numel flipped to 0 left a 2x3 tensor on no bytes at all, found by tests/fuzz/bit_flip_test).
    uint64_t elements = 1, last = 0;  // last: the furthest element the tensor reaches
    bool bad = t.storage_offset() < 0;
    for (int64_t d = 0; d < t.dim() && !bad; ++d) {
      bad = t.size(d) < 0 || t.stride(d) < 0 ||
            __builtin_mul_overflow(elements, static_cast<uint64_t>(t.size(d)), &elements);
      uint64_t reach = 0;
      bad = bad || (t.size(d) > 0 && (__builtin_mul_overflow(static_cast<uint64_t>(t.size(d) - 1),
                                                              static_cast<uint64_t>(t.stride(d)), &reach) ||
                                      __builtin_add_overflow(last, reach, &last)));
    }
    uint64_t needed = 0;
    bad = bad || (elements > 0 && (__builtin_add_overflow(last, static_cast<uint64_t>(t.storage_offset()) + 1, &last) ||
                                   __builtin_mul_overflow(last, t.dtype().itemsize(), &needed)));
    TORCH_CHECK(!bad && needed <= storage.nbytes(), "its pickle gives a tensor of shape ", t.sizes(), ", strides ",
                t.strides(), " and offset ", t.storage_offset(), " a storage of only ", storage.nbytes(), " bytes");
    if (storage.nbytes() == 0) return;
    const auto it = records_.find(storage.data());
    TORCH_CHECK(it != records_.end(), "its pickle gives a tensor a storage of ", storage.nbytes(),
                " bytes that no record of the archive holds");
    TORCH_CHECK(storage.nbytes() == it->second.bytes, "its pickle claims ", storage.nbytes(),
                " bytes for the storage in record data/", it->second.key, ", which holds ",
                it->second.bytes, " bytes");
  }

  struct Record {
    std::string key;
    size_t bytes;
  };
  std::unordered_map<const void*, Record> records_;
};

}  // namespace

// The zip archive torch.save writes: ARCHIVE/data.pkl plus one record per storage, ARCHIVE/data/KEY.
c10::IValue torch_load(const std::vector<char>& bytes) {
  // torch::pickle_load would read the same zip through an adapter that does not check bounds: a
  // corrupt end of archive made miniz read past the buffer (found by the state_dict fuzzer).
  // Python's legacy format (_use_new_zipfile_serialization=False) is a bare pickle that LibTorch
  // cannot read either.
  const bool zip = bytes.size() >= 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0;
  TORCH_CHECK(zip, "it is not a zip archive, as torch.save writes (its first bytes are not PK\\x03\\x04); "
              "a file saved with _use_new_zipfile_serialization=False must be re-saved with the default");
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzers reach the parser past the checksums
  verify_zip_checksums(bytes);
#endif
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BytesReadAdapter>(bytes));
  TORCH_CHECK(reader.hasRecord("data.pkl"), "the zip archive has no data.pkl record, so it is not a file "
              "torch.save wrote");
  const auto [pickle_data, pickle_size] = reader.getRecord("data.pkl");
  const char* p = static_cast<const char*>(pickle_data.get());
  const detail::CheckedPickle checked = detail::check_and_rewrite_pickle(std::vector<char>(p, p + pickle_size));
  check_records(reader, checked.storages);  // See Note [Storage sizes come from the pickle]
  const std::vector<char>& pickle = checked.pickle;
  size_t offset = 0;
  StorageChecker storages;
  torch::jit::Unpickler unpickler(
      [&](char* out, size_t n) {
        n = std::min(n, pickle.size() - offset);
        std::memcpy(out, pickle.data() + offset, n);
        offset += n;
        return n;
      },
      /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
      [&](const std::string& key) {
        TORCH_CHECK(reader.hasRecord("data/" + key), "the archive has no record data/", key,
                    " for a tensor its pickle refers to");
        auto [data, size] = reader.getRecord("data/" + key);
        storages.add(data, key, size);
        return std::move(data);
      },
      /*device=*/c10::nullopt);
  c10::IValue value = unpickler.parse_ivalue();
  storages.check(value);
  return value;
}

}  // namespace lockstep
