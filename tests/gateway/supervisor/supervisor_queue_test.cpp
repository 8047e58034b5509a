// The switch queue: a second switch to the same target joins the first (one launch); a switch to
// another target supersedes the queued ones; a stop aborts a start in progress; a caller that
// waits for a model gets its lease in the moment the slot becomes ready, so an operator's switch
// issued right then has to drain it first. A stop that a later switch supersedes leaves nothing
// behind; a stop cancels a request's switch that still waits out the running model's residency.
#include <doctest/doctest.h>

#include <future>

#include "gateway/supervisor/supervisor.hpp"
#include "supervisor_fixture.hpp"

using namespace servedeck;
using gateway::SlotState;
using sdtest::Fixture;
using sdtest::Lines;

namespace {

struct Result {
  std::promise<supervisor::OpResult> p;
  std::future<supervisor::OpResult> f = p.get_future();
  supervisor::Supervisor::Done done() {
    return [this](const supervisor::OpResult& r) { p.set_value(r); };
  }
  supervisor::OpResult get() {
    REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    return f.get();
  }
};

}  // namespace

TEST_CASE("switch queue: a second switch to the same target joins the first; both see its lines, one launch") {
  Fixture f;
  f.add("a", {"--slow-start-ms", "800"});
  auto& sup = f.make();
  Lines l1, l2;
  Result r1, r2;
  sup.submit_switch("a", l1.sink(), r1.done());
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::starting; }, 5000));
  sup.submit_switch("a-served", l2.sink(), r2.done());  // by served name: the same target
  auto a = r1.get();
  auto b = r2.get();
  CHECK_MESSAGE(a.ok, a.error);
  CHECK_MESSAGE(b.ok, b.error);
  CHECK(f.store->recent_launches(10).size() == 1);
  CHECK(l1.any("starting a"));
  CHECK(l2.any("ready in"));  // joined mid-load, still hears how it ended
}

TEST_CASE("switch queue: a switch to another target supersedes the queued ones; the running one finishes") {
  Fixture f;
  f.add("a", {"--slow-start-ms", "800"});
  f.add("b");
  f.add("c");
  auto& sup = f.make();
  Result ra, rb, rc;
  sup.submit_switch("a", {}, ra.done());
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::starting; }, 5000));
  sup.submit_switch("b", {}, rb.done());
  sup.submit_switch("c", {}, rc.done());
  auto b = rb.get();  // told at once, before a has finished
  CHECK_FALSE(b.ok);
  CHECK(b.error == "the switch to b was superseded by a later switch to c before it began");
  CHECK(sup.snapshot().state == SlotState::starting);
  CHECK(ra.get().ok);
  auto c = rc.get();
  CHECK_MESSAGE(c.ok, c.error);
  auto launches = f.store->recent_launches(10);
  REQUIRE(launches.size() == 2);  // a then c; b never launched
  CHECK(launches[0].model == "c");
  CHECK(launches[1].model == "a");
}

TEST_CASE("switch queue: a queued stop aborts the start in progress and supersedes queued switches") {
  Fixture f;
  auto& slow = f.add("slow", {"--slow-start-ms", "30000", "--log-progress"});
  slow.start_timeout_s = 60;
  f.add("b");
  auto& sup = f.make();
  Result rs, rb, rstop;
  sup.submit_switch("slow", {}, rs.done());
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::starting; }, 5000));
  int64_t pid = sup.snapshot().pid;
  sup.submit_switch("b", {}, rb.done());
  Lines stop_lines;
  auto t0 = state::now_ms();
  sup.submit_stop("operator", stop_lines.sink(), rstop.done());
  CHECK(rb.get().error.find("superseded by a later stop") != std::string::npos);
  CHECK(rs.get().error.find("start aborted by stop") != std::string::npos);
  auto stop = rstop.get();
  CHECK_MESSAGE(stop.ok, stop.error);
  CHECK(state::now_ms() - t0 < 15000);
  CHECK_FALSE(sdtest::alive(pid));
  CHECK(sup.snapshot().state == SlotState::stopped);
}

TEST_CASE("switch queue: a waiter's lease is taken as the slot becomes ready; an operator switch right then drains it") {
  Fixture f;
  f.add("a", {"--slow-start-ms", "300"});
  f.add("b");
  auto& sup = f.make();
  std::promise<gateway::Lease> got;
  auto leased = got.get_future();
  sup.ensure_running("a", [&got](gateway::Lease lease, std::string) { got.set_value(std::move(lease)); });
  // The operator's switch is queued while a still loads: it runs the moment a's switch ends,
  // before the waiter could have asked for a lease of its own.
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::starting; }, 5000));
  Result rb;
  Lines lines;
  sup.submit_switch("b", lines.sink(), rb.done());
  REQUIRE(leased.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  gateway::Lease lease = leased.get();
  REQUIRE(lease != nullptr);
  // The switch to b now waits for this request to finish.
  REQUIRE(sdtest::wait_for([&] { return lines.any("draining 1 in-flight request(s) on a"); }, 5000));
  auto s = sup.snapshot();
  CHECK(s.model == "a");
  CHECK(s.draining);
  CHECK(sdtest::health_status(s.port) == 200);  // a still serves the leased request
  lease.reset();
  auto b = rb.get();
  CHECK_MESSAGE(b.ok, b.error);
  CHECK(sup.snapshot().model == "b");
}

TEST_CASE("switch queue: a stop superseded by a later switch aborts only the running start; the later switch starts") {
  Fixture f;
  auto& slow = f.add("slow", {"--slow-start-ms", "30000", "--log-progress"});
  slow.start_timeout_s = 60;
  f.add("b");
  f.add("c");
  auto& sup = f.make();
  Result rs, rstop, rb;
  sup.submit_switch("slow", {}, rs.done());
  REQUIRE(sdtest::wait_for([&] { return sup.snapshot().state == SlotState::starting; }, 5000));
  sup.submit_stop("operator", {}, rstop.done());
  sup.submit_switch("b", {}, rb.done());
  auto stop = rstop.get();
  CHECK_FALSE(stop.ok);
  CHECK(stop.error == "the stop was superseded by a later switch to b before it began");
  CHECK(rs.get().error.find("start aborted by stop") != std::string::npos);
  auto b = rb.get();
  CHECK_MESSAGE(b.ok, b.error);
  CHECK(sup.snapshot().model == "b");
  // Nothing of the stop is left behind for the switches after it.
  auto c = sup.switch_to("c");
  CHECK_MESSAGE(c.ok, c.error);
  CHECK(sup.snapshot().state == SlotState::ready);
}

TEST_CASE("switch queue: a stop cancels a request-triggered switch still waiting out min_residency_s") {
  Fixture f;
  auto& a = f.add("a");
  a.min_residency_s = 60;
  f.add("b");
  auto& sup = f.make();
  REQUIRE(sup.switch_to("a").ok);
  std::promise<std::pair<bool, std::string>> waited;
  auto got = waited.get_future();
  sup.ensure_running("b", [&waited](gateway::Lease lease, std::string why) {
    waited.set_value({lease != nullptr, std::move(why)});
  });
  // Time for the request's switch to become the running job, waiting out a's residency.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(got.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  Result rstop;
  auto t0 = state::now_ms();
  sup.submit_stop("operator", {}, rstop.done());
  auto stop = rstop.get();
  CHECK_MESSAGE(stop.ok, stop.error);
  CHECK(state::now_ms() - t0 < 10000);  // not the 60 s of residency
  REQUIRE(got.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto [leased, why] = got.get();
  CHECK_FALSE(leased);
  CHECK(why.find("the switch to b was cancelled by a stop before it began") != std::string::npos);
  auto launches = f.store->recent_launches(10);
  REQUIRE(launches.size() == 1);  // b was never launched
  CHECK(launches[0].model == "a");
  CHECK(sup.snapshot().state == SlotState::stopped);
}
