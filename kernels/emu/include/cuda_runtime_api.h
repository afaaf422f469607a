// Stands in for the CUDA runtime header in an emulated build (this folder comes first on
// the include path of emulated targets only), so kernel headers that include
// <cuda_runtime.h> compile unchanged on the host.
#pragma once

#include "kernels/emu/emu.h"
