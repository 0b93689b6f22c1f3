// The board top (hw.fpga.board.BoardTop, sim=True: the clock from outside, no PLL) Verilated
// behind a bit-level UART model: the transport of sim/rtl/verilator/board.py, the C++ twin of
// sim/rtl/uart_model.py's SimTransport (same line model, same sampling), with no Python per
// cycle. Built by sim/rtl/verilator/board.py; the model's ports are clk, rst (held at 0),
// uart_rx, uart_tx and led.
//
//   board DIVISOR          then one request per line on standard input, one reply line each:
//
//   w HEX        queue the bytes HEX (8N1 characters) for uart_rx        -> "ok"
//   l LEVELS     queue raw line levels ('0'/'1', one bit time each)       -> "ok"
//   r N QUIET    clock until N bytes have been received, or QUIET cycles pass with nothing
//                received and nothing left to send: "ok HEX" (the N bytes, taken), or
//                "timeout K" (K bytes received, kept)
//   p BITS       clock until every queued level is out, then BITS bit times -> "ok"
//   c            -> "ok CYCLES" (cycles clocked so far)
//   q            exit
//
// Time advances only inside r and p, as in SimTransport: the host's own time costs no cycles.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "verilated.h"
#include "Vnpu_board_sim.h"

namespace {

class Board {
  public:
    explicit Board(int divisor) : d_(divisor) {
        m_.clk = 0;
        m_.rst = 0;
        m_.uart_rx = 1;
        m_.eval();
    }

    void write(const std::vector<uint8_t>& bytes) {
        for (uint8_t b : bytes) {
            levels_.push_back(0);
            for (int k = 0; k < 8; k++) levels_.push_back((b >> k) & 1);
            levels_.push_back(1);
        }
    }

    void write_levels(const std::string& s) {
        for (char c : s) levels_.push_back(c == '1' ? 1 : 0);
    }

    // One clock cycle: the line model acts on the values before the edge, as the testbench of
    // SimTransport does after each tick (it sets uart_rx for the next cycle and samples uart_tx).
    void cycle() {
        m_.clk = 1;
        m_.eval();
        m_.clk = 0;
        m_.eval();
        cycles_++;
        if (rx_left_ == 0) {
            if (!levels_.empty()) {
                m_.uart_rx = levels_.front();
                levels_.pop_front();
                rx_left_ = d_;
            } else {
                m_.uart_rx = 1;
            }
        }
        if (rx_left_) rx_left_--;
        m_.eval();
        int tx = m_.uart_tx;
        if (tx_phase_ < 0) {
            if (!tx) {
                tx_phase_ = 0;
                tx_bits_ = 0;
            }
        } else {
            tx_phase_++;
            long t = tx_phase_ - d_ / 2;
            if (t >= 0) {
                long k = t / d_, at = t % d_;
                if (at == 0 && k >= 1 && k <= 8) tx_bits_ |= tx << (k - 1);
                else if (at == 0 && k == 9) {
                    if (tx) received_.push_back(static_cast<uint8_t>(tx_bits_));
                    tx_phase_ = -1;  // a low stop bit: the character is dropped
                }
            }
        }
    }

    // SimTransport.read: steps of 10 bit times until n bytes are in or the line stays quiet.
    bool read(size_t n, long quiet_limit, std::vector<uint8_t>* out) {
        long quiet = 0;
        const long step = 10L * d_;
        while (received_.size() < n) {
            size_t have = received_.size();
            for (long i = 0; i < step; i++) cycle();
            quiet = (received_.size() > have || !levels_.empty()) ? 0 : quiet + step;
            if (quiet > quiet_limit) return false;
        }
        out->assign(received_.begin(), received_.begin() + n);
        received_.erase(received_.begin(), received_.begin() + n);
        return true;
    }

    void pause(long bits) {
        while (!levels_.empty()) {
            long c = static_cast<long>(levels_.size()) * d_;
            for (long i = 0; i < c; i++) cycle();
        }
        for (long i = 0; i < bits * d_; i++) cycle();
    }

    size_t received() const { return received_.size(); }
    uint64_t cycles() const { return cycles_; }

  private:
    Vnpu_board_sim m_;
    int d_;
    std::deque<uint8_t> levels_;
    std::deque<uint8_t> received_;
    long rx_left_ = 0;
    long tx_phase_ = -1;
    int tx_bits_ = 0;
    uint64_t cycles_ = 0;
};

std::vector<uint8_t> unhex(const std::string& s) {
    std::vector<uint8_t> out;
    for (size_t i = 0; i + 1 < s.size(); i += 2)
        out.push_back(static_cast<uint8_t>(std::stoul(s.substr(i, 2), nullptr, 16)));
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    Verilated::commandArgs(argc, argv);
    if (argc < 2) {
        std::fprintf(stderr, "usage: board DIVISOR\n");
        return 2;
    }
    Board board(std::atoi(argv[1]));
    std::string line;
    int ch;
    while (true) {
        line.clear();
        while ((ch = std::getchar()) != EOF && ch != '\n') line.push_back(static_cast<char>(ch));
        if (ch == EOF && line.empty()) return 0;
        if (line.empty()) continue;
        char op = line[0];
        std::string arg = line.size() > 2 ? line.substr(2) : "";
        if (op == 'q') return 0;
        if (op == 'w') {
            board.write(unhex(arg));
            std::printf("ok\n");
        } else if (op == 'l') {
            board.write_levels(arg);
            std::printf("ok\n");
        } else if (op == 'r') {
            size_t n = 0;
            long quiet = 0;
            std::sscanf(arg.c_str(), "%zu %ld", &n, &quiet);
            std::vector<uint8_t> out;
            if (board.read(n, quiet, &out)) {
                std::printf("ok ");
                for (uint8_t b : out) std::printf("%02x", b);
                std::printf("\n");
            } else {
                std::printf("timeout %zu\n", board.received());
            }
        } else if (op == 'p') {
            board.pause(std::atol(arg.c_str()));
            std::printf("ok\n");
        } else if (op == 'c') {
            std::printf("ok %llu\n", static_cast<unsigned long long>(board.cycles()));
        } else {
            std::printf("error unknown request %c\n", op);
        }
        std::fflush(stdout);
    }
}
