// run_simulation (the library behind `mla run`) with RunConfig::own_stream on the cpu: the
// runtime has no streams (create_stream gives nullptr), so the run is the plain one and its
// reference checks pass; on cuda the same option puts the backends, their pool and the layers
// on a non-blocking stream of the run's own (tests/gpu/concurrency_gpu_test.cc).
#include <gtest/gtest.h>

#include "mla/memory.h"
#include "sim/run_driver.h"

namespace mla {
namespace {

TEST(RunSimulation, OwnStreamOnTheCpuRunsAndChecks) {
  EXPECT_EQ(*device_runtime(DeviceType::kCpu)->create_stream(), nullptr);
  cli::RunConfig c;
  c.backend = "chunked_mla";
  c.layers = 1;
  c.workload.num_requests = 8;
  c.workload.seed = 5;
  c.scheduler.seed = 5;
  c.scheduler.speculative_tokens = 2;
  c.check = true;
  c.check_steps = 2;
  c.progress = false;
  c.own_stream = true;
  auto report = cli::run_simulation(c);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_TRUE(report->check_passed) << "max rel err " << report->max_rel_err;
  EXPECT_GT(report->checks.size(), 0u);
}

}  // namespace
}  // namespace mla
