// The published runs (published.h), as the paper prints them.
#include "common/planner/published.h"

namespace course::planner {

const std::vector<PublishedRun>& megatron_2021_table1() {
  static const std::vector<PublishedRun> rows = {
      {1.7, {24, 2304, 24, 2048, 51200}, 1, 1, 32, 512, 137, 44, 4.4},
      {3.6, {30, 3072, 32, 2048, 51200}, 2, 1, 64, 512, 138, 44, 8.8},
      {7.5, {36, 4096, 32, 2048, 51200}, 4, 1, 128, 512, 142, 46, 18.2},
      {18.4, {40, 6144, 48, 2048, 51200}, 8, 1, 256, 1024, 135, 43, 34.6},
      {39.1, {48, 8192, 64, 2048, 51200}, 8, 2, 512, 1536, 138, 44, 70.8},
      {76.1, {60, 10240, 80, 2048, 51200}, 8, 4, 1024, 1792, 140, 45, 143.8},
      {145.6, {80, 12288, 96, 2048, 51200}, 8, 8, 1536, 2304, 148, 47, 227.1},
      {310.1, {96, 16384, 128, 2048, 51200}, 8, 16, 1920, 2160, 155, 50, 297.4},
      {529.6, {105, 20480, 128, 2048, 51200}, 8, 35, 2520, 2520, 163, 52, 410.2},
      {1008.0, {128, 25600, 160, 2048, 51200}, 8, 64, 3072, 3072, 163, 52, 502.0},
  };
  return rows;
}

const std::vector<PublishedRun>& megatron_2021_table2_gpt3() {
  static const std::vector<PublishedRun> rows = {
      {174.6, {96, 12288, 96, 2048, 51200}, 8, 12, 384, 1536, 153, 0, 0},
      {174.6, {96, 12288, 96, 2048, 51200}, 8, 12, 1536, 1536, 141, 0, 0},
  };
  return rows;
}

const PublishedSweep& megatron_2021_figure13() {
  static const PublishedSweep sweep = {162.2, {32, 20480, 128, 2048, 51200}, 64, {2, 4, 8, 16, 32}, {32, 128}, 8, 8};
  return sweep;
}

}  // namespace course::planner
