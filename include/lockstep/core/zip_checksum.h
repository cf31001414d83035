#pragma once

#include <vector>

namespace lockstep {

// Checks every record of a zip archive (the format torch.save and torch::pickle_save write)
// against the CRC-32 its central directory stores. LibTorch's reader skips this check (its miniz is
// built without CRC checks), so a flipped bit inside a tensor would load as a changed weight.
// Throws c10::Error naming the record and both checksums, or what is wrong with the archive's
// structure, or a compressed record that would inflate far past the archive's size (Note [Records
// that inflate]). Callers add the file's name.
void verify_zip_checksums(const std::vector<char>& bytes);

}  // namespace lockstep
