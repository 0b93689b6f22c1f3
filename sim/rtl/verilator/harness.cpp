// The C++ host of a ring or a torus of Verilated ChipNodes (npu_node: one chip and its outgoing
// ring links): load, run, read back, with no Python per cycle. Built once per hardware
// configuration by sim/rtl/verilator/build.py, which generates "ports.h" (the payload field
// offsets and every port's address and width; NPU_TORUS when the node has a column's link);
// the chip count and the torus's shape are the job's, one model per chip.
//
//   harness JOB RESULT      run the job file JOB, write RESULT (formats: sim/rtl/verilator/runner.py)
//
// The models are joined as hw.system.ChipSystem joins its nodes (on a ring of N, node i's
// ring.tx to node (i + 1) mod N's ring.rx; on an X x Y torus, node (x, y)'s ring.tx to node
// (x + 1, y)'s ring.rx and its ring_y.tx to node (x, y + 1)'s ring_y.rx; chip_id = y * X + x,
// row_first and row_last its row's ids) and clocked in lockstep; the host keeps ChipSystem's
// own `cycles` counter. It drives the chips with the same handshakes as sim/rtl/system_runner.py:
// every chip's program through host.imem and its images through host.wr (one word per cycle,
// all chips at once), one `start` pulse, the clock until every chip is done or max_cycles, then
// every chip's counters, its trace buffer (host.trace_addr -> trace_data, one cycle) and the
// requested regions (host.rd_addr -> rd_data, one word at a time). A job with bare_cycles > 0
// instead clocks the ring from its initial state that many cycles with every host input at 0:
// the speed limit.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "verilated.h"
#include "Vnpu_fast.h"
#include "Vnpu_fast___024root.h"

namespace {

// A port of the Verilated model: its storage (CData/SData/IData/QData or VlWide words) and width
// (a ring's node has no column ports: those stay null).
struct Port {
    void* p = nullptr;
    int bits = 0;
};

// Every port of one node (sim/rtl/verilator/build.py: NODE_PORTS).
struct NodePorts {
    Port imem_valid, imem_payload, wr_valid, wr_ready, wr_payload;
    Port rd_addr_valid, rd_addr_ready, rd_addr_payload, rd_data_valid, rd_data_ready,
        rd_data_payload;
    Port trace_addr, trace_data, trace_count, trace_overflow;
    Port start, chip_id, link_stall;
    Port done, error, cycles, busy, pc;
    Port rx_valid, rx_ready, rx_payload, tx_valid, tx_ready, tx_payload;
    Port busy_cycles[16];  // hw.spec.isa.BUSY_COUNTERS, NPU_BUSY_COUNTERS of them
    // A torus's node: its row's ids, its column's link (build.py: TORUS_PORTS).
    Port row_first, row_last, link_stall_y;
    Port rx_y_valid, rx_y_ready, rx_y_payload, tx_y_valid, tx_y_ready, tx_y_payload;
};

}  // namespace

#include "ports.h"

static_assert(NPU_BUSY_COUNTERS <= 16, "NodePorts holds 16 busy counters");

namespace {

constexpr int kMaxWords = 64;  // 2048-bit payloads: far above any configuration's
static_assert(NPU_WR_ADDR_BITS + NPU_WR_DATA_BITS <= 32 * kMaxWords &&
                  NPU_IMEM_ADDR_BITS + NPU_IMEM_DATA_BITS <= 32 * kMaxWords,
              "a host payload is wider than the harness's word buffers");

// Bytes of a port's storage: CData, SData, IData, QData or VlWide's 32-bit words.
size_t storage(const Port& q) {
    if (q.bits <= 8) return 1;
    if (q.bits <= 16) return 2;
    if (q.bits <= 32) return 4;
    if (q.bits <= 64) return 8;
    return 4 * ((q.bits + 31) / 32);
}

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

// The model of one chip and its link, and whether an input changed since its last eval().
struct Node {
    std::unique_ptr<Vnpu_fast> top;
    NodePorts p;
    bool dirty = true;
};

class Harness {
  public:
    // `chips` = x_dim * y_dim nodes (a ring: y_dim 1). `check`: test at every settle that the
    // signals between the nodes need no second pass (settle()).
    Harness(int x_dim, int y_dim, bool check)
        : ctx_(new VerilatedContext), node_(x_dim * y_dim), x_(x_dim), y_(y_dim), check_(check) {
        const int chips = x_dim * y_dim;
        if (y_dim > 1 && !NPU_TORUS) fail("a torus job for a ring's node (built without ring_y)");
        for (int c = 0; c < chips; c++) {
            Node& n = node_[c];
            n.top.reset(new Vnpu_fast(ctx_.get(), ("node" + std::to_string(c)).c_str()));
            npu_bind(n.top.get(), &n.p);
            const uint64_t mask = (uint64_t{1} << n.p.chip_id.bits) - 1;
            put_int(n.p.chip_id, c & mask);  // a bare ring may be longer than the ids
            if (torus()) {
                put_int(n.p.row_first, (c - c % x_) & mask);
                put_int(n.p.row_last, (c - c % x_ + x_ - 1) & mask);
            }
        }
        west_.resize(chips);
        east_.resize(chips);
        north_.resize(chips);
        south_.resize(chips);
        for (int c = 0; c < chips; c++) {
            const int x = c % x_, y = c / x_;
            west_[c] = y * x_ + (x + x_ - 1) % x_;
            east_[c] = y * x_ + (x + 1) % x_;
            north_[c] = (y + y_ - 1) % y_ * x_ + x;
            south_[c] = (y + 1) % y_ * x_ + x;
        }
    }

    // Whether the nodes are joined along columns too (a torus; a ring's nodes have no ring_y).
    bool torus() const { return y_ > 1; }

    int chips() const { return static_cast<int>(node_.size()); }

    // An input of chip c; its model is evaluated again at the next settle().
    void set(int c, Port NodePorts::*port, uint64_t v) {
        put_int(node_[c].p.*port, v);
        node_[c].dirty = true;
    }
    void set_words(int c, Port NodePorts::*port, const uint32_t* w) {
        put(node_[c].p.*port, w);
        node_[c].dirty = true;
    }
    uint64_t get(int c, Port NodePorts::*port) const { return get_int(node_[c].p.*port); }
    const NodePorts& ports(int c) const { return node_[c].p; }

    // Settle every combinational signal after inputs or registers changed: each node's
    // ring.rx takes its predecessor's ring.tx (valid, payload), the nodes whose inputs changed
    // are evaluated (their ring.rx.ready then holds), and each node's ring.tx.ready takes its
    // successor's ring.rx.ready. One pass is enough: ring.tx.valid and payload are the link's
    // registers, and ring.tx.ready reaches only the next state of the link's registers
    // (hw.system.ChipNode), so the ready written last changes no output before the clock edge,
    // whose eval() reads it with the other inputs. With `check_`, every settle tests both.
    // On a torus the same, each node's ring_y.rx from the node above it and its ring_y.tx.ready
    // from the node below.
    void settle() {
        const int n = chips();
        const bool t = torus();
        for (int c = 0; c < n; c++) {
            const NodePorts& from = node_[west_[c]].p;
            Node& to = node_[c];
            const bool valid = copy(from.tx_valid, to.p.rx_valid);
            const bool payload = copy(from.tx_payload, to.p.rx_payload);
            if (valid || payload) to.dirty = true;
            if (t) {
                const NodePorts& up = node_[north_[c]].p;
                const bool vy = copy(up.tx_y_valid, to.p.rx_y_valid);
                const bool py = copy(up.tx_y_payload, to.p.rx_y_payload);
                if (vy || py) to.dirty = true;
            }
        }
        for (Node& node : node_) {
            if (!node.dirty) continue;
            if (check_) {
                const Snapshot before(node.p);
                node.top->eval();
                if (!before.same_tx(node.p))
                    fail("a node's ring.tx changed with its inputs: a combinational path");
            } else {
                node.top->eval();
            }
            node.dirty = false;
        }
        for (int c = 0; c < n; c++) {
            copy(node_[east_[c]].p.rx_ready, node_[c].p.tx_ready);
            if (t) copy(node_[south_[c]].p.rx_y_ready, node_[c].p.tx_y_ready);
        }
        if (check_) {
            for (Node& node : node_) {
                const Snapshot before(node.p);
                node.top->eval();
                if (!before.same_tx(node.p) || !before.same_ready(node.p))
                    fail("a node's ring.tx.ready reached its outputs: a combinational path");
            }
        }
    }

    // One clock cycle of the ring: settle, ChipSystem's `cycles` counter, every rising edge.
    void tick() {
        settle();
        if (start_) {
            running_ = true;
            cycles_ = 0;
        } else if (running_) {
            if (all_done()) running_ = false;
            else cycles_++;
        }
        for (Node& node : node_) clock(node.top.get());
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

    // Every chip's `done` (a register: it holds right after the clock edge).
    bool all_done() const {
        for (const Node& node : node_)
            if (!*static_cast<const uint8_t*>(node.p.done.p)) return false;
        return true;
    }

    // Registers start at their initial values (no reset: the wrapper ties rst to 0, and
    // Amaranth's simulator does not reset either).
    void init() {
        for (Node& node : node_) node.top->clk = 0;
        settle();
    }

    // Every chip's program (host.imem, always ready), then its images (host.wr, until ready),
    // one word per cycle on every chip at once.
    void load(const std::vector<ChipJob>& jobs) {
        struct Cursor {
            size_t insn = 0, image = 0, word = 0;
        };
        const int n = chips();
        std::vector<Cursor> at(n);
        std::vector<char> take(n);
        uint32_t w[kMaxWords];
        for (;;) {
            bool busy = false;
            for (int c = 0; c < n; c++) {
                const ChipJob& job = jobs[c];
                Cursor& k = at[c];
                take[c] = false;
                while (k.image < job.images.size() && k.word == job.images[k.image].count) {
                    k.image++;
                    k.word = 0;
                }
                set(c, &NodePorts::imem_valid, 0);
                set(c, &NodePorts::wr_valid, 0);
                if (k.insn < job.program.size()) {
                    std::memset(w, 0, sizeof w);
                    set_field_int(w, NPU_IMEM_ADDR_OFF, NPU_IMEM_ADDR_BITS, k.insn);
                    set_field_int(w, NPU_IMEM_DATA_OFF, NPU_IMEM_DATA_BITS, job.program[k.insn]);
                    set_words(c, &NodePorts::imem_payload, w);
                    set(c, &NodePorts::imem_valid, 1);
                    busy = take[c] = true;
                } else if (k.image < job.images.size()) {
                    const Image& img = job.images[k.image];
                    std::memset(w, 0, sizeof w);
                    set_field_int(w, NPU_WR_ADDR_OFF, NPU_WR_ADDR_BITS, img.base + k.word);
                    set_field(w, NPU_WR_DATA_OFF, NPU_WR_DATA_BITS,
                              img.words + k.word * NPU_WORD_BYTES);
                    set_words(c, &NodePorts::wr_payload, w);
                    set(c, &NodePorts::wr_valid, 1);
                    busy = true;
                }
            }
            if (!busy) break;
            settle();
            for (int c = 0; c < n; c++)
                if (!take[c] && get(c, &NodePorts::wr_valid) && get(c, &NodePorts::wr_ready))
                    take[c] = true;
            tick();
            for (int c = 0; c < n; c++) {
                if (!take[c]) continue;
                if (at[c].insn < jobs[c].program.size()) at[c].insn++;
                else at[c].word++;
            }
        }
        settle();
    }

    // Pulse start, clock until done; false when more than max_cycles passed (as wait_done).
    // Link stalls: bit k of chip c's link_stall is bit c * latency + k of ChipSystem's, and on
    // a torus bit k of its link_stall_y bit chips * latency + c * latency_y + k, drawn in that
    // order.
    bool run(uint64_t max_cycles, double stall_prob, uint64_t seed, uint64_t* ran) {
        Rng rng(seed);
        const int n = chips();
        const bool stalls = stall_prob > 0;
        auto draw = [&](Port NodePorts::*port) {
            const int lat = (node_[0].p.*port).bits;
            for (int c = 0; c < n; c++) {
                uint64_t bits = 0;
                for (int b = 0; b < lat; b++)
                    if (rng.uniform() < stall_prob) bits |= uint64_t{1} << b;
                if (bits != get(c, port)) set(c, port, bits);
            }
        };
        auto stall = [&] {
            draw(&NodePorts::link_stall);
            if (torus()) draw(&NodePorts::link_stall_y);
        };
        start_ = true;
        for (int c = 0; c < n; c++) set(c, &NodePorts::start, 1);
        if (stalls) stall();
        tick();
        start_ = false;
        for (int c = 0; c < n; c++) set(c, &NodePorts::start, 0);
        settle();
        uint64_t k = 0;
        while (!all_done()) {
            if (stalls) stall();
            tick();
            if (++k > max_cycles) break;
        }
        if (stalls) {
            for (int c = 0; c < n; c++) {
                set(c, &NodePorts::link_stall, 0);
                if (torus()) set(c, &NodePorts::link_stall_y, 0);
            }
            settle();
        }
        *ran = k;
        return k <= max_cycles;
    }

    // Trace entries of every chip: host.trace_addr = k, one cycle, host.trace_data.
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> traces() {
        const int n = chips();
        std::vector<std::vector<std::pair<uint64_t, uint64_t>>> out(n);
        std::vector<uint64_t> count(n);
        uint64_t most = 0;
        for (int c = 0; c < n; c++) {
            count[c] = get(c, &NodePorts::trace_count);
            if (count[c] > most) most = count[c];
        }
        uint32_t w[kMaxWords];
        for (uint64_t k = 0; k < most; k++) {
            for (int c = 0; c < n; c++)
                if (k < count[c]) set(c, &NodePorts::trace_addr, k);
            tick();
            for (int c = 0; c < n; c++) {
                if (k >= count[c]) continue;
                ::get(node_[c].p.trace_data, w);
                out[c].emplace_back(get_field_int(w, NPU_TRACE_CYCLE_OFF, NPU_TRACE_CYCLE_BITS),
                                    get_field_int(w, NPU_TRACE_BUSY_OFF, NPU_TRACE_BUSY_BITS));
            }
        }
        return out;
    }

    // `count` words from `base` of chip c, one at a time (as host_read).
    void read(int c, uint64_t base, uint64_t count, Writer& out) {
        uint32_t w[kMaxWords];
        uint8_t word[NPU_WORD_BYTES + 8];
        set(c, &NodePorts::rd_data_ready, 1);
        for (uint64_t i = 0; i < count; i++) {
            std::memset(w, 0, sizeof w);
            set_field_int(w, NPU_RD_ADDR_OFF, NPU_RD_ADDR_BITS, base + i);
            set_words(c, &NodePorts::rd_addr_payload, w);
            set(c, &NodePorts::rd_addr_valid, 1);
            for (bool ready = false; !ready;) {
                settle();
                ready = get(c, &NodePorts::rd_addr_ready);
                tick();
            }
            set(c, &NodePorts::rd_addr_valid, 0);
            for (bool valid = false; !valid;) {
                settle();
                valid = get(c, &NodePorts::rd_data_valid);
                if (valid) {
                    ::get(node_[c].p.rd_data_payload, w);
                    get_field(w, NPU_RD_DATA_OFF, NPU_RD_DATA_BITS, word);
                }
                tick();
            }
            out.raw(word, NPU_WORD_BYTES);
        }
        set(c, &NodePorts::rd_data_ready, 0);
        settle();
    }

    uint32_t cycles() const { return cycles_; }
    uint64_t ticks() const { return ticks_; }

  private:
    // Copy port `from` into port `to` (of the same width); whether `to` changed.
    static bool copy(const Port& from, const Port& to) {
        const size_t n = storage(from);
        if (!std::memcmp(from.p, to.p, n)) return false;
        std::memcpy(to.p, from.p, n);
        return true;
    }

    // A node's ring outputs (of both dimensions on a torus), to test that an eval() left them
    // as they were.
    struct Snapshot {
        explicit Snapshot(const NodePorts& p) {
            tx = {&p.tx_valid, &p.tx_payload};
            rdy = {&p.rx_ready};
            if (p.tx_y_valid.p) {
                tx.push_back(&p.tx_y_valid);
                tx.push_back(&p.tx_y_payload);
                rdy.push_back(&p.rx_y_ready);
            }
            for (const Port* q : tx) tx_bytes.push_back(take(*q));
            for (const Port* q : rdy) ready_bytes.push_back(take(*q));
        }
        static std::vector<uint8_t> take(const Port& q) {
            const auto* b = static_cast<const uint8_t*>(q.p);
            return std::vector<uint8_t>(b, b + storage(q));
        }
        static bool same(const std::vector<const Port*>& ports,
                         const std::vector<std::vector<uint8_t>>& bytes) {
            for (size_t k = 0; k < ports.size(); k++)
                if (std::memcmp(ports[k]->p, bytes[k].data(), bytes[k].size())) return false;
            return true;
        }
        bool same_tx(const NodePorts&) const { return same(tx, tx_bytes); }
        bool same_ready(const NodePorts&) const { return same(rdy, ready_bytes); }
        std::vector<const Port*> tx, rdy;
        std::vector<std::vector<uint8_t>> tx_bytes, ready_bytes;
    };

    std::unique_ptr<VerilatedContext> ctx_;
    std::vector<Node> node_;
    int x_, y_;                                     // the torus's dimensions (a ring: N x 1)
    std::vector<int> west_, east_, north_, south_;  // each node's neighbours
    bool check_;
    bool start_ = false, running_ = false;  // ChipSystem's `start` input and `running` register
    uint32_t cycles_ = 0;                   // ChipSystem's `cycles` (32 bits)
    uint64_t ticks_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) fail("usage: harness JOB RESULT");
    Reader job(argv[1]);
    if (std::memcmp(job.bytes(8), "NPUJOB03", 8)) fail("not a job file");
    const uint64_t chips = job.u64(), word_bytes = job.u64(), max_cycles = job.u64(),
                   seed = job.u64(), bare = job.u64(), flags = job.u64(), x_dim = job.u64();
    const double stall_prob = job.f64();
    if (word_bytes != NPU_WORD_BYTES)
        fail("job for " + std::to_string(word_bytes) + "-byte words, model built for " +
             std::to_string(NPU_WORD_BYTES));
    if (chips < 1 || chips > 4096) fail("job for " + std::to_string(chips) + " chips");
    if (x_dim < 1 || chips % x_dim) fail("job for a torus whose rows do not divide its chips");
    const int n = static_cast<int>(chips);
    std::vector<ChipJob> jobs(n);
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

    Harness h(static_cast<int>(x_dim), static_cast<int>(chips / x_dim), flags & 1);
    Writer out;
    out.raw("NPURES03", 8);
    h.init();
    if (bare) {
        const double t0 = now();
        for (uint64_t i = 0; i < bare; i++) h.tick();
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
    out.u64(done ? 0 : 1);
    out.u64(h.cycles());
    out.u64(ran);
    out.u64(load_ticks);
    for (int c = 0; c < n; c++) {
        out.u64(h.get(c, &NodePorts::cycles));
        out.u64(h.get(c, &NodePorts::done));
        out.u64(h.get(c, &NodePorts::error));
        out.u64(h.get(c, &NodePorts::pc));
        out.u64(h.get(c, &NodePorts::busy));
        for (int k = 0; k < NPU_BUSY_COUNTERS; k++) out.u64(get_int(h.ports(c).busy_cycles[k]));
    }
    if (done) {
        auto traces = h.traces();
        for (int c = 0; c < n; c++) {
            out.u64(traces[c].size());
            out.u64(h.get(c, &NodePorts::trace_overflow));
            for (auto& e : traces[c]) {
                out.u64(e.first);
                out.u64(e.second);
            }
        }
        for (int c = 0; c < n; c++)
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
