// Charts from inside a chapter: the records a chapter wrote as metrics, drawn by scripts/plot.py (the
// course's one plotting script, matplotlib), so `07_zero --compare` leaves its PNGs behind without a
// second command. Python is only needed for the pictures: without it the run still passes, and says
// how to draw them later.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace course::metrics {

// Runs `plot.py KIND RECORDS PREFIX` on `records` (written to a temporary JSON-lines file) with a
// python3 that has matplotlib. Returns true when the charts were drawn; otherwise `why` says why.
bool draw_charts(const std::string& kind, const std::vector<nlohmann::json>& records, const std::string& prefix,
                 std::string* why);

// Runs `plot.py timeline TRACE PNG`: a Chrome trace drawn as one row per rank and lane.
bool draw_timeline(const std::string& trace, const std::string& png, std::string* why);

}  // namespace course::metrics
