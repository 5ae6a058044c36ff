// Private temporary files: folders only this user can enter, files created
// fresh (never through a link another user planted in a shared /tmp).
//
// Expects: nothing; TMPDIR may be unset, missing or not a folder.
// Guarantees: make_private_folder gives a new folder (mkdtemp, mode 0700)
// or an Error naming the temp folder and why; write_new_file creates the
// file (O_EXCL | O_NOFOLLOW, mode 0600) and writes all of it, or says why.
#pragma once

#include <filesystem>
#include <string>

#include "kiln/status.h"

namespace kiln::runtime {

// A new folder `<temp>/<prefix>XXXXXX` that only this user can use.
Expected<std::filesystem::path> make_private_folder(const std::string& prefix);

// Creates `path` (which must not exist, and is not followed if a link) and
// writes `data` to it.
Expected<bool> write_new_file(const std::filesystem::path& path, const std::string& data);

}  // namespace kiln::runtime
