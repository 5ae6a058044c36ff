// kiln's public API in one include.
#pragma once

#include "kiln/executable.h"
#include "kiln/graph.h"
#include "kiln/host_tensor.h"
#include "kiln/options.h"
#include "kiln/reference.h"
#include "kiln/status.h"
#include "kiln/types.h"
