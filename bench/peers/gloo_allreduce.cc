// gloo_allreduce: Gloo peer for `bench/compare` (issue 3).
//
// Runs N ranks as N forked processes on this machine, rendezvous through a
// gloo FileStore in a fresh temp directory, TCP transport on loopback, and
// times float32 sum all-reduce with every algorithm this gloo offers:
//
//   ring              gloo::allreduce (new API), Algorithm RING (its default)
//   bcube_new         gloo::allreduce (new API), Algorithm BCUBE
//   legacy_ring       gloo::AllreduceRing<float>
//   ring_chunked      gloo::AllreduceRingChunked<float>
//   halving_doubling  gloo::AllreduceHalvingDoubling<float>
//   bcube             gloo::AllreduceBcube<float>
//
// Output: rank 0 prints one JSON object per (size, algorithm) on stdout, the
// schema of `cohort bench --json`:
//   {"impl":"gloo","algo":"ring_chunked","ranks":2,"size":1048576,
//    "count":262144,"dtype":"f32","op":"sum","time_us":..,"first_us":..,
//    "algbw":..,"busbw":..,"iters":..,"warmup":..}
// time_us = slowest rank's loop time / iters (steady state, after warmup);
// first_us = slowest rank's time for the first call of that (size, algo),
// including the per-size setup the API needs (legacy algorithm object
// construction, buffer registration); algbw = size / time (GB/s = 1e9 B/s);
// busbw = algbw * 2(n-1)/n.
//
// Usage: gloo_allreduce -n N [--sizes S1,S2,..] [--iters I1,I2,..]
//                       [--warmup W1,W2,..] [--algos a,b,..] [--host ADDR]
// Sizes in bytes (K/M/G suffixes allowed); --iters/--warmup take one value
// for all sizes or one per size.
#include <gloo/algorithm.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double nowUs() {
  return std::chrono::duration<double, std::micro>(
             Clock::now().time_since_epoch())
      .count();
}

struct Config {
  int ranks = 2;
  std::vector<size_t> sizes{4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  std::vector<long> iters;   // empty: default schedule
  std::vector<long> warmup;  // empty: default schedule
  std::vector<std::string> algos{"ring",         "bcube_new",
                                 "legacy_ring",  "ring_chunked",
                                 "halving_doubling", "bcube"};
  std::string host = "127.0.0.1";
  double targetMs = 300;  // used when --iters is not given
  int rank = -1;          // --rank: run this rank only (one per host)
  std::string store;      // --store: its FileStore directory (shared)
};

size_t parseSize(const std::string& s) {
  char* end = nullptr;
  double v = strtod(s.c_str(), &end);
  if (end == s.c_str()) {
    fprintf(stderr, "gloo_allreduce: bad size '%s'\n", s.c_str());
    exit(2);
  }
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    if (c > pos) out.push_back(s.substr(pos, c - pos));
    pos = c + 1;
  }
  return out;
}

long perSize(const std::vector<long>& v, size_t i, long dflt) {
  if (v.empty()) return dflt;
  if (v.size() == 1) return v[0];
  return i < v.size() ? v[i] : v.back();
}

void usage() {
  fprintf(stderr,
          "usage: gloo_allreduce -n N [--sizes S,..] [--iters I,..] "
          "[--warmup W,..] [--target-ms T] [--algos ring,bcube_new,legacy_ring,ring_chunked,"
          "halving_doubling,bcube] [--host ADDR]\n"
          "       [--rank R --store DIR]: run rank R only, rendezvous in "
          "DIR (ranks on several hosts sharing a file system)\n");
  exit(2);
}

Config parseArgs(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "-n" || a == "--ranks") {
      c.ranks = atoi(next().c_str());
    } else if (a == "--sizes") {
      c.sizes.clear();
      for (auto& s : split(next())) c.sizes.push_back(parseSize(s));
    } else if (a == "--iters") {
      c.iters.clear();
      for (auto& s : split(next())) c.iters.push_back(atol(s.c_str()));
    } else if (a == "--warmup") {
      c.warmup.clear();
      for (auto& s : split(next())) c.warmup.push_back(atol(s.c_str()));
    } else if (a == "--algos") {
      c.algos = split(next());
    } else if (a == "--target-ms") {
      c.targetMs = atof(next().c_str());
    } else if (a == "--host") {
      c.host = next();
    } else if (a == "--rank") {
      c.rank = atoi(next().c_str());
    } else if (a == "--store") {
      c.store = next();
    } else {
      usage();
    }
  }
  if (c.ranks < 1 || c.sizes.empty()) usage();
  return c;
}

// One (size, algorithm) runner: first() does setup + the first call,
// run() one steady-state call.
struct Runner {
  virtual ~Runner() {}
  virtual void run() = 0;
};

struct NewApiRunner : Runner {
  gloo::AllreduceOptions opts;
  NewApiRunner(const std::shared_ptr<gloo::Context>& ctx, float* buf,
               size_t count, gloo::AllreduceOptions::Algorithm algo)
      : opts(ctx) {
    opts.setAlgorithm(algo);
    opts.setOutput(buf, count);
    void (*fn)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
    opts.setReduceFunction(fn);
    opts.setTag(7);
  }
  void run() override { gloo::allreduce(opts); }
};

struct LegacyRunner : Runner {
  std::unique_ptr<gloo::Algorithm> algo;
  void run() override { algo->run(); }
};

std::unique_ptr<Runner> makeRunner(const std::string& name,
                                   const std::shared_ptr<gloo::Context>& ctx,
                                   float* buf, size_t count) {
  std::vector<float*> ptrs{buf};
  if (name == "ring")
    return std::unique_ptr<Runner>(new NewApiRunner(
        ctx, buf, count, gloo::AllreduceOptions::Algorithm::RING));
  if (name == "bcube_new")
    return std::unique_ptr<Runner>(new NewApiRunner(
        ctx, buf, count, gloo::AllreduceOptions::Algorithm::BCUBE));
  std::unique_ptr<LegacyRunner> r(new LegacyRunner);
  int n = (int)count;
  if (name == "legacy_ring")
    r->algo.reset(new gloo::AllreduceRing<float>(ctx, ptrs, n));
  else if (name == "ring_chunked")
    r->algo.reset(new gloo::AllreduceRingChunked<float>(ctx, ptrs, n));
  else if (name == "halving_doubling")
    r->algo.reset(new gloo::AllreduceHalvingDoubling<float>(ctx, ptrs, n));
  else if (name == "bcube")
    r->algo.reset(new gloo::AllreduceBcube<float>(ctx, ptrs, n));
  else
    return nullptr;
  return std::unique_ptr<Runner>(r.release());
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(1);
  gloo::barrier(opts);
}

// Element-wise max across ranks of a few doubles (timing results).
void maxAcross(const std::shared_ptr<gloo::Context>& ctx, double* v,
               size_t n) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(v, n);
  void (*fn)(void*, const void*, const void*, size_t) = &gloo::max<double>;
  opts.setReduceFunction(fn);
  opts.setTag(3);
  gloo::allreduce(opts);
}

std::shared_ptr<gloo::Context> connect(
    gloo::rendezvous::Store& store, const std::string& prefix,
    std::shared_ptr<gloo::transport::Device>& dev, int rank, int size) {
  gloo::rendezvous::PrefixStore ps(prefix, store);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  rctx->setTimeout(std::chrono::seconds(300));
  rctx->connectFullMesh(ps, dev);
  return rctx;
}

int rankMain(const Config& cfg, int rank, const std::string& storeDir) {
  gloo::transport::tcp::attr attr;
  attr.hostname = cfg.host;
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(storeDir);
  // One context (full mesh of TCP pairs) per algorithm plus one for control
  // (barriers, result reduction): with a shared context, running a legacy
  // algorithm first made later new-API calls on the same pairs 50-150x
  // slower (gloo 0.5.0 on loopback), which would misrepresent Gloo.
  auto ctl = connect(store, "ctl", dev, rank, cfg.ranks);
  std::vector<std::shared_ptr<gloo::Context>> ctxs;
  for (const auto& name : cfg.algos)
    ctxs.push_back(connect(store, "algo-" + name, dev, rank, cfg.ranks));

  size_t maxBytes = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());
  size_t maxCount = maxBytes / sizeof(float);
  // Persistent buffer, allocated once and touched before any timing.
  std::vector<float> buf(maxCount > 0 ? maxCount : 1);
  const int n = cfg.ranks;
  const float expect = (float)(n * (n + 1) / 2);
  int failures = 0;

  for (size_t si = 0; si < cfg.sizes.size(); si++) {
    size_t bytes = cfg.sizes[si];
    size_t count = bytes / sizeof(float);
    // Fixed counts when --iters is given, else calibrated per algorithm so
    // the timed loop takes about --target-ms.
    long fixedIters = perSize(cfg.iters, si, 0);
    long minWarm = perSize(cfg.warmup, si, 2);
    for (size_t ai = 0; ai < cfg.algos.size(); ai++) {
      const std::string& name = cfg.algos[ai];
      const std::shared_ptr<gloo::Context>& ctx = ctxs[ai];
      std::fill(buf.begin(), buf.begin() + count, (float)(rank + 1));
      barrier(ctl);
      double t0 = nowUs();
      std::unique_ptr<Runner> r = makeRunner(name, ctx, buf.data(), count);
      if (!r) {
        if (rank == 0)
          fprintf(stderr, "gloo_allreduce: unknown algorithm '%s'\n",
                  name.c_str());
        return 2;
      }
      r->run();
      double first = nowUs() - t0;
      double warmSpent = 0;
      // Correctness of the first call (every rank contributed rank+1).
      bool ok = true;
      for (size_t k = 0; k < count; k += std::max<size_t>(1, count / 64))
        if (buf[k] != expect) ok = false;
      if (count > 0 && buf[count - 1] != expect) ok = false;
      // Warmup in batches 1,1,2,4,.. until --warmup calls are done and,
      // when calibrating, a fifth of the target time has passed. Ranks agree
      // on the slowest rank's batch time, hence on the iteration count.
      // The first call counts as warmup.
      const bool calibrate = fixedIters <= 0;
      long warm = 1, batch = 1;
      double est = first;
      for (int k = 0;; k++) {
        bool enough = warm >= minWarm &&
                      (!calibrate ||
                       (k > 0 && warmSpent >= cfg.targetMs * 200.0));
        if (enough) break;
        double b0 = nowUs();
        for (long w = 0; w < batch; w++) r->run();
        double bt[1] = {nowUs() - b0};
        maxAcross(ctl, bt, 1);
        warmSpent += bt[0];
        est = bt[0] / batch;
        warm += batch;
        if (k > 0) batch *= 2;
      }
      long iters = fixedIters;
      if (iters <= 0) {
        double want = cfg.targetMs * 1000.0 / std::max(est, 0.01);
        iters = (long)std::ceil(std::min(std::max(want, 3.0), 1e6));
      }
      barrier(ctl);
      t0 = nowUs();
      for (long it = 0; it < iters; it++) r->run();
      double loop = nowUs() - t0;
      double res[3] = {loop, first, ok ? 0.0 : 1.0};
      maxAcross(ctl, res, 3);
      barrier(ctl);
      r.reset();
      if (res[2] != 0.0) failures++;
      if (rank == 0) {
        double t = res[0] / iters;
        double algbw = t > 0 ? (double)bytes / (t * 1e3) : 0.0;
        double busbw = algbw * 2.0 * (n - 1) / n;
        printf(
            "{\"impl\":\"gloo\",\"algo\":\"%s\",\"ranks\":%d,\"size\":%zu,"
            "\"count\":%zu,\"dtype\":\"f32\",\"op\":\"sum\",\"time_us\":%.3f,"
            "\"first_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,\"iters\":%ld,"
            "\"warmup\":%ld,\"correct\":%s}\n",
            name.c_str(), n, bytes, count, t, res[1], algbw, busbw, iters,
            warm, res[2] == 0.0 ? "true" : "false");
        fflush(stdout);
      }
    }
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg = parseArgs(argc, argv);
  if (cfg.rank >= 0) {
    if (cfg.store.empty() || cfg.rank >= cfg.ranks) usage();
    try {
      return rankMain(cfg, cfg.rank, cfg.store);
    } catch (const std::exception& e) {
      fprintf(stderr, "gloo_allreduce rank %d: %s\n", cfg.rank, e.what());
      return 1;
    }
  }
  char tmpl[] = "/tmp/gloo-bench-XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("mkdtemp");
    return 1;
  }
  std::string dir = tmpl;
  pid_t parent = getpid();
  std::vector<pid_t> kids;
  for (int r = 0; r < cfg.ranks; r++) {
    fflush(stdout);
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      return 1;
    }
    if (p == 0) {
      // Die with the launcher (e.g. when `timeout` kills it).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      int rc = 1;
      try {
        rc = rankMain(cfg, r, dir);
      } catch (const std::exception& e) {
        fprintf(stderr, "gloo_allreduce rank %d: %s\n", r, e.what());
        rc = 1;
      }
      fflush(stdout);
      _exit(rc);
    }
    kids.push_back(p);
  }
  int rc = 0;
  for (size_t i = 0; i < kids.size(); i++) {
    int st = 0;
    pid_t p = wait(&st);
    if (p < 0) break;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      if (!rc)
        fprintf(stderr, "gloo_allreduce: a rank failed (status %d); "
                        "stopping the others\n", st);
      rc = 1;
      for (pid_t k : kids)
        if (k != p) kill(k, SIGKILL);
    }
  }
  // Remove the rendezvous files.
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
