// tmaflow device library: the single include. Sub-headers are grouped by hardware unit.
// Coordinates on the device side are innermost-first, as in PTX (c0 is the contiguous dim).
#pragma once
#include "tmaflow/prelude.cuh"
#include "tmaflow/trace.cuh"
#include "tmaflow/fence.cuh"
#include "tmaflow/warp.cuh"
#include "tmaflow/debug.cuh"
#include "tmaflow/mbarrier.cuh"
#include "tmaflow/signal.cuh"
#include "tmaflow/tma.cuh"
#include "tmaflow/tensormap.cuh"
#include "tmaflow/bulk.cuh"
#include "tmaflow/cp_async.cuh"
#include "tmaflow/cluster.cuh"
#include "tmaflow/griddep.cuh"
#include "tmaflow/pipeline.cuh"
#include "tmaflow/wgmma.cuh"
#include "tmaflow/mma.cuh"
