// pqloader: deterministic, parallel Parquet → tensor batch loading.
//
// Umbrella header of the public C++ API. Typical use:
//
//   pqloader::LoaderOptions options;
//   options.plan.batch_size = 1024;
//   ARROW_ASSIGN_OR_RAISE(auto loader, pqloader::Loader::Make({"/data/train"}, options));
//   ARROW_RETURN_NOT_OK(loader->StartEpoch(0));
//   while (true) {
//     ARROW_ASSIGN_OR_RAISE(auto batch, loader->Next());
//     if (!batch) break;
//     ...
//   }
#pragma once

#include "pqloader/cache_admin.h"
#include "pqloader/dataset/dataset.h"
#include "pqloader/error.h"
#include "pqloader/io/filesystem.h"
#include "pqloader/loader.h"
#include "pqloader/plan/epoch_plan.h"
#include "pqloader/random/philox.h"
#include "pqloader/tensor/batch.h"
