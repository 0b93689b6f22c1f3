// The C++ host of a Verilated ChipSystem (npu_system): load, run, read back, with no Python per
// cycle. Built once per hardware configuration by sim/rtl/verilator/build.py, which generates
// "ports.h" (the chip count, the payload field offsets and every port's address and width).
//
//   harness JOB RESULT      run the job file JOB, write RESULT (formats: sim/rtl/verilator/runner.py)
//
// It drives only ChipSystem's ports, with the same handshakes as sim/rtl/system_runner.py:
// every chip's program through host.imem and its images through host.wr (one word per cycle,
// all chips at once), one `start` pulse, the clock until `done` or max_cycles, then every
// chip's counters, its trace buffer (host.trace_addr -> trace_data, one cycle) and the
// requested regions (host.rd_addr -> rd_data, one word at a time). A job with bare_cycles > 0
// instead clocks the model from its initial state that many cycles with every input at 0: the speed limit.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "verilated.h"
#include "Vnpu_fast.h"
#include "Vnpu_fast___024root.h"

namespace {

// A port of the Verilated model: its storage (CData/SData/IData/QData or VlWide words) and width.
struct Port {
    void* p;
    int bits;
};

struct ChipPorts {
    Port imem_valid, imem_payload, wr_valid, wr_ready, wr_payload;
    Port rd_addr_valid, rd_addr_ready, rd_addr_payload, rd_data_valid, rd_data_ready,
        rd_data_payload;
    Port trace_addr, trace_data, trace_count, trace_overflow;
    Port cycles, busy, pc;
    Port busy_cycles[16];  // hw.spec.isa.BUSY_COUNTERS, NPU_BUSY_COUNTERS of them
};

}  // namespace

#include "ports.h"

static_assert(NPU_BUSY_COUNTERS <= 16, "ChipPorts holds 16 busy counters");

namespace {

constexpr int kMaxWords = 64;  // 2048-bit payloads: far above any configuration's
static_assert(NPU_WR_ADDR_BITS + NPU_WR_DATA_BITS <= 32 * kMaxWords &&
                  NPU_IMEM_ADDR_BITS + NPU_IMEM_DATA_BITS <= 32 * kMaxWords,
              "a host payload is wider than the harness's word buffers");

void put(const Port& q, const uint32_t* w) {
    if (q.bits <= 8) *static_cast<uint8_t*>(q.p) = static_cast<uint8_t>(w[0]);
    else if (q.bits <= 16) *static_cast<uint16_t*>(q.p) = static_cast<uint16_t>(w[0]);
    else if (q.bits <= 32) *static_cast<uint32_t*>(q.p) = w[0];
    else if (q.bits <= 64) *static_cast<uint64_t*>(q.p) = w[0] | static_cast<uint64_t>(w[1]) << 32;
    else std::memcpy(q.p, w, 4 * ((q.bits + 31) / 32));
}

void get(const Port& q, uint32_t* w) {
    std::memset(w, 0, 4 * kMaxWords);
    if (q.bits <= 8) w[0] = *static_cast<uint8_t*>(q.p);
    else if (q.bits <= 16) w[0] = *static_cast<uint16_t*>(q.p);
    else if (q.bits <= 32) w[0] = *static_cast<uint32_t*>(q.p);
    else if (q.bits <= 64) {
        uint64_t v = *static_cast<uint64_t*>(q.p);
        w[0] = static_cast<uint32_t>(v);
        w[1] = static_cast<uint32_t>(v >> 32);
    } else std::memcpy(w, q.p, 4 * ((q.bits + 31) / 32));
}

void put_int(const Port& q, uint64_t v) {
    uint32_t w[kMaxWords] = {static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)};
    put(q, w);
}

uint64_t get_int(const Port& q) {
    uint32_t w[kMaxWords];
    get(q, w);
    return w[0] | static_cast<uint64_t>(w[1]) << 32;
}

// Bit fields of a payload held as 32-bit words, LSB first (Amaranth's struct packing).
void set_field(uint32_t* w, int off, int width, const uint8_t* src) {
    for (int i = 0; i < width; i++)
        if (src[i >> 3] >> (i & 7) & 1) w[(off + i) >> 5] |= 1u << ((off + i) & 31);
}

void set_field_int(uint32_t* w, int off, int width, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = static_cast<uint8_t>(v >> (8 * i));
    set_field(w, off, width, b);
}

void get_field(const uint32_t* w, int off, int width, uint8_t* dst) {
    std::memset(dst, 0, (width + 7) / 8);
    for (int i = 0; i < width; i++)
        if (w[(off + i) >> 5] >> ((off + i) & 31) & 1) dst[i >> 3] |= 1u << (i & 7);
}

uint64_t get_field_int(const uint32_t* w, int off, int width) {
    uint8_t b[8] = {};
    get_field(w, off, width, b);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    return v;
}

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "npu harness: %s\n", why.c_str());
    std::exit(2);
}

class Reader {
  public:
    explicit Reader(const char* path) {
        FILE* f = std::fopen(path, "rb");
        if (!f) fail(std::string("cannot open job ") + path);
        std::fseek(f, 0, SEEK_END);
        data_.resize(static_cast<size_t>(std::ftell(f)));
        std::fseek(f, 0, SEEK_SET);
        if (std::fread(data_.data(), 1, data_.size(), f) != data_.size()) fail("short job file");
        std::fclose(f);
    }
    const uint8_t* bytes(size_t n) {
        if (pos_ + n > data_.size()) fail("truncated job file");
        const uint8_t* p = data_.data() + pos_;
        pos_ += n;
        return p;
    }
    uint64_t u64() {
        uint64_t v;
        std::memcpy(&v, bytes(8), 8);
        return v;
    }
    double f64() {
        double v;
        std::memcpy(&v, bytes(8), 8);
        return v;
    }

  private:
    std::vector<uint8_t> data_;
    size_t pos_ = 0;
};

class Writer {
  public:
    void u64(uint64_t v) { raw(&v, 8); }
    void f64(double v) { raw(&v, 8); }
    void raw(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        data_.insert(data_.end(), b, b + n);
    }
    void save(const char* path) {
        std::string tmp = std::string(path) + ".part";
        FILE* f = std::fopen(tmp.c_str(), "wb");
        if (!f || std::fwrite(data_.data(), 1, data_.size(), f) != data_.size())
            fail(std::string("cannot write ") + tmp);
        std::fclose(f);
        if (std::rename(tmp.c_str(), path)) fail(std::string("cannot rename to ") + path);
    }

  private:
    std::vector<uint8_t> data_;
};

struct Image {
    uint64_t base, count;
    const uint8_t* words;
};

struct ChipJob {
    std::vector<uint64_t> program;
    std::vector<Image> images;
    std::vector<std::pair<uint64_t, uint64_t>> reads;
};

// xoshiro256** seeded through splitmix64: the link-stall pattern of a seed.
class Rng {
  public:
    explicit Rng(uint64_t seed) {
        for (auto& s : s_) {
            seed += 0x9E3779B97F4A7C15ull;
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            s = z ^ (z >> 31);
        }
    }
    uint64_t next() {
        uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

class Harness {
  public:
    Harness() : ctx_(new VerilatedContext), top_(new Vnpu_fast(ctx_.get())) {
        npu_bind(top_.get(), chip_, &link_stall_);
    }

    // One clock cycle: the rising edge samples the inputs set before it.
    void tick() {
        clock(top_.get());
        ticks_++;
    }

    // A rising edge, then the clock low again. Nothing happens on the falling edge, so when the
    // model's edge detector can be told that the clock is low, that eval() is skipped (it would
    // only re-evaluate the logic that depends on inputs, which the next eval() does anyway).
    // (A template, so that the requires-expression is checked only when instantiated.)
    template <class Model>
    static void clock(Model* top) {
        top->clk = 1;
        top->eval();
        top->clk = 0;
        auto* root = top->rootp;
        if constexpr (requires { root->__Vtrigprevexpr___TOP__clk__0; })
            root->__Vtrigprevexpr___TOP__clk__0 = 0;
        else
            top->eval();
    }

    // Settle combinational outputs after inputs changed (a handshake's `ready`, `valid`).
    void settle() { top_->eval(); }

    // Registers start at their initial values (no reset: the wrapper ties rst to 0, and
    // Amaranth's simulator does not reset either).
    void init() {
        top_->clk = 0;
        settle();
    }

    // Every chip's program (host.imem, always ready), then its images (host.wr, until ready),
    // one word per cycle on every chip at once.
    void load(const std::vector<ChipJob>& jobs) {
        struct Cursor {
            size_t insn = 0, image = 0, word = 0;
        };
        std::vector<Cursor> at(NPU_CHIPS);
        uint32_t w[kMaxWords];
        for (;;) {
            bool busy = false;
            bool take[NPU_CHIPS] = {};
            for (int c = 0; c < NPU_CHIPS; c++) {
                const ChipJob& job = jobs[c];
                Cursor& k = at[c];
                ChipPorts& p = chip_[c];
                while (k.image < job.images.size() && k.word == job.images[k.image].count) {
                    k.image++;
                    k.word = 0;
                }
                put_int(p.imem_valid, 0);
                put_int(p.wr_valid, 0);
                if (k.insn < job.program.size()) {
                    std::memset(w, 0, sizeof w);
                    set_field_int(w, NPU_IMEM_ADDR_OFF, NPU_IMEM_ADDR_BITS, k.insn);
                    set_field_int(w, NPU_IMEM_DATA_OFF, NPU_IMEM_DATA_BITS, job.program[k.insn]);
                    put(p.imem_payload, w);
                    put_int(p.imem_valid, 1);
                    busy = take[c] = true;
                } else if (k.image < job.images.size()) {
                    const Image& img = job.images[k.image];
                    std::memset(w, 0, sizeof w);
                    set_field_int(w, NPU_WR_ADDR_OFF, NPU_WR_ADDR_BITS, img.base + k.word);
                    set_field(w, NPU_WR_DATA_OFF, NPU_WR_DATA_BITS,
                              img.words + k.word * NPU_WORD_BYTES);
                    put(p.wr_payload, w);
                    put_int(p.wr_valid, 1);
                    busy = true;
                }
            }
            if (!busy) break;
            settle();
            for (int c = 0; c < NPU_CHIPS; c++)
                if (!take[c] && get_int(chip_[c].wr_valid) && get_int(chip_[c].wr_ready))
                    take[c] = true;
            tick();
            for (int c = 0; c < NPU_CHIPS; c++) {
                if (!take[c]) continue;
                if (at[c].insn < jobs[c].program.size()) at[c].insn++;
                else at[c].word++;
            }
        }
        settle();
    }

    // Pulse start, clock until done; false when more than max_cycles passed (as wait_done).
    bool run(uint64_t max_cycles, double stall_prob, uint64_t seed, uint64_t* ran) {
        Rng rng(seed);
        const bool stalls = stall_prob > 0 && link_stall_.bits > 0;
        auto stall = [&] {
            uint32_t w[kMaxWords] = {};
            for (int b = 0; b < link_stall_.bits; b++)
                if (rng.uniform() < stall_prob) w[b >> 5] |= 1u << (b & 31);
            put(link_stall_, w);
        };
        top_->start = 1;
        if (stalls) stall();
        tick();
        top_->start = 0;
        settle();
        uint64_t n = 0;
        if (stalls) {
            while (!top_->done) {
                stall();
                tick();
                if (++n > max_cycles) break;
            }
            put_int(link_stall_, 0);
            settle();
        } else {
            while (!top_->done) {
                tick();
                if (++n > max_cycles) break;
            }
        }
        *ran = n;
        return n <= max_cycles;
    }

    // Trace entries of every chip: host.trace_addr = k, one cycle, host.trace_data.
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> traces() {
        std::vector<std::vector<std::pair<uint64_t, uint64_t>>> out(NPU_CHIPS);
        uint64_t count[NPU_CHIPS], most = 0;
        for (int c = 0; c < NPU_CHIPS; c++) {
            count[c] = get_int(chip_[c].trace_count);
            if (count[c] > most) most = count[c];
        }
        uint32_t w[kMaxWords];
        for (uint64_t k = 0; k < most; k++) {
            for (int c = 0; c < NPU_CHIPS; c++)
                if (k < count[c]) put_int(chip_[c].trace_addr, k);
            tick();
            for (int c = 0; c < NPU_CHIPS; c++) {
                if (k >= count[c]) continue;
                get(chip_[c].trace_data, w);
                out[c].emplace_back(get_field_int(w, NPU_TRACE_CYCLE_OFF, NPU_TRACE_CYCLE_BITS),
                                    get_field_int(w, NPU_TRACE_BUSY_OFF, NPU_TRACE_BUSY_BITS));
            }
        }
        return out;
    }

    // `count` words from `base` of chip c, one at a time (as host_read).
    void read(int c, uint64_t base, uint64_t count, Writer& out) {
        ChipPorts& p = chip_[c];
        uint32_t w[kMaxWords];
        uint8_t word[NPU_WORD_BYTES + 8];
        put_int(p.rd_data_ready, 1);
        for (uint64_t i = 0; i < count; i++) {
            std::memset(w, 0, sizeof w);
            set_field_int(w, NPU_RD_ADDR_OFF, NPU_RD_ADDR_BITS, base + i);
            put(p.rd_addr_payload, w);
            put_int(p.rd_addr_valid, 1);
            for (bool ready = false; !ready;) {
                settle();
                ready = get_int(p.rd_addr_ready);
                tick();
            }
            put_int(p.rd_addr_valid, 0);
            for (bool valid = false; !valid;) {
                settle();
                valid = get_int(p.rd_data_valid);
                if (valid) {
                    get(p.rd_data_payload, w);
                    get_field(w, NPU_RD_DATA_OFF, NPU_RD_DATA_BITS, word);
                }
                tick();
            }
            out.raw(word, NPU_WORD_BYTES);
        }
        put_int(p.rd_data_ready, 0);
        settle();
    }

    Vnpu_fast* top() { return top_.get(); }
    ChipPorts& chip(int c) { return chip_[c]; }
    uint64_t ticks() const { return ticks_; }

  private:
    std::unique_ptr<VerilatedContext> ctx_;
    std::unique_ptr<Vnpu_fast> top_;
    ChipPorts chip_[NPU_CHIPS];
    Port link_stall_;
    uint64_t ticks_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) fail("usage: harness JOB RESULT");
    Reader job(argv[1]);
    if (std::memcmp(job.bytes(8), "NPUJOB01", 8)) fail("not a job file");
    const uint64_t chips = job.u64(), word_bytes = job.u64(), max_cycles = job.u64(),
                   seed = job.u64(), bare = job.u64();
    const double stall_prob = job.f64();
    if (chips != NPU_CHIPS || word_bytes != NPU_WORD_BYTES)
        fail("job for " + std::to_string(chips) + " chips of " + std::to_string(word_bytes) +
             "-byte words, model built for " + std::to_string(NPU_CHIPS) + " of " +
             std::to_string(NPU_WORD_BYTES));
    std::vector<ChipJob> jobs(NPU_CHIPS);
    for (auto& cj : jobs) {
        cj.program.resize(job.u64());
        for (auto& insn : cj.program) insn = job.u64();
        cj.images.resize(job.u64());
        for (auto& img : cj.images) {
            img.base = job.u64();
            img.count = job.u64();
            img.words = job.bytes(img.count * NPU_WORD_BYTES);
        }
        cj.reads.resize(job.u64());
        for (auto& r : cj.reads) {
            r.first = job.u64();
            r.second = job.u64();
        }
    }

    Harness h;
    Writer out;
    out.raw("NPURES01", 8);
    h.init();
    if (bare) {
        Vnpu_fast* top = h.top();
        const double t0 = now();
        for (uint64_t i = 0; i < bare; i++) Harness::clock(top);
        const double wall = now() - t0;
        out.u64(2);
        out.u64(bare);
        out.f64(wall);
        out.save(argv[2]);
        return 0;
    }
    const double t0 = now();
    h.load(jobs);
    const uint64_t load_ticks = h.ticks();
    const double t1 = now();
    uint64_t ran = 0;
    const bool done = h.run(max_cycles, stall_prob, seed, &ran);
    const double t2 = now();
    Vnpu_fast* top = h.top();
    out.u64(done ? 0 : 1);
    out.u64(top->cycles);
    out.u64(ran);
    out.u64(load_ticks);
    const uint64_t done_bits = top->chip_done, error_bits = top->chip_error;
    for (int c = 0; c < NPU_CHIPS; c++) {
        out.u64(get_int(h.chip(c).cycles));
        out.u64(done_bits >> c & 1);
        out.u64(error_bits >> c & 1);
        out.u64(get_int(h.chip(c).pc));
        out.u64(get_int(h.chip(c).busy));
        for (int k = 0; k < NPU_BUSY_COUNTERS; k++) out.u64(get_int(h.chip(c).busy_cycles[k]));
    }
    if (done) {
        auto traces = h.traces();
        for (int c = 0; c < NPU_CHIPS; c++) {
            out.u64(traces[c].size());
            out.u64(get_int(h.chip(c).trace_overflow));
            for (auto& e : traces[c]) {
                out.u64(e.first);
                out.u64(e.second);
            }
        }
        for (int c = 0; c < NPU_CHIPS; c++)
            for (auto& r : jobs[c].reads) h.read(c, r.first, r.second, out);
    }
    const double t3 = now();
    out.u64(h.ticks());
    out.f64(t1 - t0);
    out.f64(t2 - t1);
    out.f64(t3 - t2);
    out.save(argv[2]);
    return 0;
}
