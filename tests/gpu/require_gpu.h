// GPU tests skip, and say why, where no GPU or driver is present.
#pragma once

#include <gtest/gtest.h>

#include "runtime/cuda_driver.h"

#define REQUIRE_GPU()                                                         \
  do {                                                                        \
    ::kiln::Expected<const ::kiln::runtime::Driver*> d = ::kiln::runtime::driver(); \
    if (!d) GTEST_SKIP() << "skipped: " << d.error().message;                 \
  } while (0)
