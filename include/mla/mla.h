// Umbrella header.
#pragma once
#include "mla/backend.h"
#include "mla/batch.h"
#include "mla/gpu_support.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/ops.h"
#include "mla/status.h"
#include "mla/tensor.h"
#include "mla/types.h"
