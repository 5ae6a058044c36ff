// Diagnostics of the library: through Options::log, never to stderr.
#pragma once

#include <string_view>

#include "kiln/options.h"

namespace kiln::detail {

void log(LogLevel level, std::string_view message);
inline void warn(std::string_view message) { log(LogLevel::warning, message); }

}  // namespace kiln::detail
