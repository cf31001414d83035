// What lockstep's process holds beside the torch wheel's LibTorch, read from the binaries with ldd
// and nm: the Gloo that runs is libtorch's (Note [Gloo headers] in src/dist/gloo_backend.cpp), and
// no library of ours exports a symbol libtorch's own code could bind to instead of its own (Note
// [Convolutions for inference] in src/models/inference_conv.cpp: why lockstep links no oneDNN).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "../test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// The shared libraries `binary` loads, by file name: "libtorch_cpu.so" -> its path.
std::map<std::string, std::string> loaded_libraries(const std::string& binary) {
  const auto r = testing::run_command("ldd " + binary);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, std::string> found;
  std::istringstream lines(r.output);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t arrow = line.find(" => ");
    if (arrow == std::string::npos) continue;
    const std::string name = line.substr(line.find_first_not_of(" \t"), arrow - line.find_first_not_of(" \t"));
    const std::string rest = line.substr(arrow + 4);
    found[name] = rest.substr(0, rest.find(" ("));
  }
  return found;
}

// The dynamic symbols `library` defines (mangled).
std::set<std::string> exported_symbols(const std::string& library) {
  const auto r = testing::run_command("nm -D --defined-only " + library + " | awk 'NF == 3 {print $3}'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> symbols;
  std::istringstream lines(r.output);
  for (std::string s; std::getline(lines, s);) symbols.insert(s);
  return symbols;
}

std::string name_starting(const std::map<std::string, std::string>& libraries, const std::string& prefix) {
  for (const auto& [name, path] : libraries)
    if (name.rfind(prefix, 0) == 0) return path;
  return "";
}

TEST(LibrarySymbols, TheCliLoadsLibTorchFromTheWheelAndNoGlooOrOneDnnOfItsOwn) {
  const auto libraries = loaded_libraries(LOCKSTEP_CLI);
  const std::string torch_cpu = name_starting(libraries, "libtorch_cpu.so");
  ASSERT_FALSE(torch_cpu.empty()) << "lockstep does not load libtorch_cpu.so";
  EXPECT_TRUE(fs::exists(torch_cpu)) << torch_cpu;
  EXPECT_TRUE(name_starting(libraries, "libgloo").empty()) << name_starting(libraries, "libgloo");
  EXPECT_TRUE(name_starting(libraries, "libdnnl").empty()) << name_starting(libraries, "libdnnl");
  EXPECT_TRUE(name_starting(libraries, "libmkldnn").empty());
}

// Whether a demangled symbol two libraries both export is harmless: an instantiation of a template
// of the C++ standard library (the same code from the same libstdc++ headers either way) whose
// arguments are the standard library's or built-in types, or a function pointer or reference. The
// latter covers std::call_once's trampolines over protobuf's once-initializers (`void (&)(const
// google::protobuf::FieldDescriptor*)`), which call through the pointer they are given and so run
// each library's own function, and protobuf's enum Descriptor::WellKnownType (an int either way).
bool harmless_to_share(std::string demangled) {
  static const std::regex std_entity(
      R"(^(typeinfo for |typeinfo name for |vtable for |(void|int|bool|unsigned long|long) )?(std|__gnu_cxx)::)");
  if (!std::regex_search(demangled, std_entity)) return false;
  demangled = std::regex_replace(demangled, std::regex("google::protobuf::Descriptor::WellKnownType"), "int");
  for (const char* foreign : {"google::", "onnx", "dnnl", "c10::", "at::", "torch::", "gloo::"}) {
    if (demangled.find(foreign) == std::string::npos) continue;
    const bool through_pointer = demangled.find("call_once<void (&)(") != std::string::npos ||
                                 demangled.find("call_once<void (*)(") != std::string::npos;
    if (!through_pointer) return false;
  }
  return true;
}

// libtorch_cpu.so's references to its own exported functions go through the dynamic linker
// (GLOB_DAT and JUMP_SLOT relocations), so another library in the process that exports the same
// name would win for whichever comes first. Debian's protobuf and ONNX, which lockstep links for
// export, must share only harmless names with it.
TEST(LibrarySymbols, DebiansProtobufAndOnnxExportNothingOfLibTorchsOwn) {
  const auto libraries = loaded_libraries(LOCKSTEP_CLI);
  std::set<std::string> torch;
  for (const char* name : {"libtorch_cpu.so", "libtorch.so", "libc10.so"}) {
    const std::string path = name_starting(libraries, name);
    ASSERT_FALSE(path.empty()) << name;
    const auto symbols = exported_symbols(path);
    torch.insert(symbols.begin(), symbols.end());
  }
  ASSERT_GT(torch.size(), 10000u);
  int checked = 0;
  for (const char* name : {"libprotobuf.so", "libonnx.so", "libonnx_proto.so"}) {
    const std::string path = name_starting(libraries, name);
    if (path.empty()) continue;  // linked statically or not at all: nothing to bind
    ++checked;
    testing::TempDir dir;
    std::ofstream shared(dir / "shared.txt");
    for (const std::string& s : exported_symbols(path))
      if (torch.count(s) != 0) shared << s << "\n";
    shared.close();
    const auto r = testing::run_command("c++filt < " + dir / "shared.txt");
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      EXPECT_TRUE(harmless_to_share(line)) << name << " and libtorch both export: " << line;
  }
  EXPECT_GE(checked, 1) << "lockstep loads none of Debian's protobuf and ONNX libraries";
}

// See Note [Gloo headers]: Debian's Gloo headers compile ProcessGroupGloo.hpp, but no code of Gloo's
// own may be instantiated from them into lockstep's objects.
TEST(LibrarySymbols, LockstepDefinesNoGlooCode) {
  const std::string archive = (fs::path(LOCKSTEP_CLI).parent_path() / "liblockstep.a").string();
  ASSERT_TRUE(fs::exists(archive)) << archive;
  const auto r = testing::run_command("nm -C --defined-only " + archive +
                                      " | grep -E ' [TtWwVvRrDdBb] (vtable for |typeinfo for |typeinfo name for )?gloo::'");
  EXPECT_EQ(r.output, "") << "liblockstep.a defines Gloo code compiled from Debian's headers";
  // And the archive does call into libtorch's Gloo backend (the check above looks at the right thing).
  const auto used = testing::run_command("nm -C --undefined-only " + archive + " | grep -c 'c10d::ProcessGroupGloo::'");
  EXPECT_NE(used.output.substr(0, 1), "0") << used.output;
}

}  // namespace
}  // namespace lockstep
