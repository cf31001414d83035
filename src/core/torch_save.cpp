#include "lockstep/core/torch_save.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace lockstep {

// Note [Files torch.load reads with weights_only]
// LibTorch's torch::pickle_save wraps every typed list and dict in a call to
// torch.jit._pickle.restore_type_tag, and writes lists of ints, floats, bools and tensors through
// torch.jit._pickle.build_intlist and its siblings, so that TorchScript can give them back their
// static types. Since PyTorch 2.6 Python's torch.load unpickles with weights_only=True by default
// and refuses those globals: a state dict or checkpoint written by pickle_save then loads only with
// weights_only=False, which runs whatever the file names. lockstep writes the same archive
// (data.pkl, data/<n> per tensor storage, version) from a pickle of plain dicts, lists and tuples
// (typed lists turned generic, no tags): the values are the same, and LibTorch's own reader
// (torch_load) infers their types as it does for files Python wrote.
namespace {

c10::IValue plain(const c10::IValue& v) {
  if (v.isList()) {  // IntList, DoubleList, BoolList, TensorList and generic lists alike
    c10::impl::GenericList out(c10::AnyType::get());
    for (const c10::IValue& e : v.toListRef()) out.push_back(plain(e));
    return out;
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict out(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& item : v.toGenericDict()) out.insert(plain(item.key()), plain(item.value()));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& e : v.toTupleRef().elements()) elements.push_back(plain(e));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}

}  // namespace

std::vector<char> torch_save(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { pickle.insert(pickle.end(), data, data + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(plain(value));
  pickler.stop();
  std::vector<char> bytes;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    bytes.insert(bytes.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return bytes;
}

}  // namespace lockstep
