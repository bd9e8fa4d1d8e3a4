// muon_oracle.hpp - a plain double-precision Muon (torch.optim.Muon's step on one whole
// matrix) and the derived bound of the fp32 host twin against it (docs/muon.md), for the
// unit and MPI tests of issue 34. Independent of the code under test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shardopt/fused_adam.hpp"
#include "shardopt/muon.hpp"

namespace shardopt::test::muon {

/// Deterministic values in (-1, 1) of (step, param, element): the initial master (step -1)
/// and the gradients.
inline float value(int step, int param, std::int64_t j) {
  const double x = std::sin(0.37 * static_cast<double>(j) + 1.3 * param + 2.1 * step + 0.5) *
                   std::cos(0.11 * static_cast<double>(j * (param + 2)) + 0.7 * step);
  return static_cast<float>(x);
}

/// Pseudo-random values in (-1, 1) of (stream, element) (splitmix64): matrices of them have
/// well-spread singular values, unlike value()'s smooth ones, whose many tiny singular
/// values the quintic amplifies ~3.4^5 times (with bf16 roundings the result is then far
/// from the double one, within the bound but not usefully: docs/muon.md).
inline float noise(int stream, std::int64_t j) {
  std::uint64_t z = (static_cast<std::uint64_t>(stream) << 40) ^ static_cast<std::uint64_t>(j);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) / 4503599627370496.0 - 1.0);
}

// ---------------------------------------------------------------- the double oracle

/// torch.optim.Muon's step on one whole matrix in double: momentum m, parameter p, and
/// the running bound on |p - the fp32 host twin's p| (host_bound_step).
struct OracleMatrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> p, m;
  double bound = 0.0;
  int steps = 0;
};

/// X (n x k, row-major) of a rows x cols matrix x: x itself, or its transpose when rows > cols.
inline std::vector<double> to_x(const std::vector<double>& x, std::int64_t rows, std::int64_t cols) {
  const bool tr = rows > cols;
  std::vector<double> X(x.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      X[static_cast<std::size_t>(tr ? j * rows + i : i * cols + j)] = x[static_cast<std::size_t>(i * cols + j)];
  return X;
}
inline std::vector<double> from_x(const std::vector<double>& X, std::int64_t rows, std::int64_t cols) {
  const bool tr = rows > cols;
  std::vector<double> x(X.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      x[static_cast<std::size_t>(i * cols + j)] = X[static_cast<std::size_t>(tr ? j * rows + i : i * cols + j)];
  return x;
}

inline double frob(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

/// One Newton-Schulz step on X (n x k): X <- a X + (b A + c A A) X, A = X X^T. Returns
/// ||A||_F (for the bound).
inline double ns_step(std::vector<double>& X, std::int64_t n, std::int64_t k, const MuonSettings& s) {
  const double a = s.ns_coefficients[0], b = s.ns_coefficients[1], c = s.ns_coefficients[2];
  std::vector<double> A(static_cast<std::size_t>(n * n), 0.0), B(A.size(), 0.0), Y(X.size(), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t l = 0; l < k; ++l) A[i * n + j] += X[i * k + l] * X[j * k + l];
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double aa = 0.0;
      for (std::int64_t l = 0; l < n; ++l) aa += A[i * n + l] * A[l * n + j];
      B[i * n + j] = b * A[i * n + j] + c * aa;
    }
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t l = 0; l < k; ++l) {
      double bx = 0.0;
      for (std::int64_t j = 0; j < n; ++j) bx += B[i * n + j] * X[j * k + l];
      Y[i * k + l] = a * X[i * k + l] + bx;
    }
  X = Y;
  return frob(A);
}

/// X_0 .. X_S of the double iteration on the normalized x (X_0 = x or its transpose).
inline std::vector<std::vector<double>> ns_iterates(const std::vector<double>& x, std::int64_t rows, std::int64_t cols,
                                                    const MuonSettings& s) {
  const std::int64_t n = std::min(rows, cols), k = std::max(rows, cols);
  std::vector<std::vector<double>> Xs{to_x(x, rows, cols)};
  for (int st = 0; st < s.ns_steps; ++st) {
    std::vector<double> X = Xs.back();
    (void)ns_step(X, n, k, s);
    Xs.push_back(X);
  }
  return Xs;
}

/// The orthogonalized update of a normalized rows x cols matrix x, in double.
inline std::vector<double> ns_double(const std::vector<double>& x, std::int64_t rows, std::int64_t cols,
                                     const MuonSettings& s) {
  std::vector<double> X = to_x(x, rows, cols);
  for (int t = 0; t < s.ns_steps; ++t) (void)ns_step(X, std::min(rows, cols), std::max(rows, cols), s);
  return from_x(X, rows, cols);
}

/// C = op(A) op(B) for small dense matrices (row-major): C[i][j] = sum_l A[i][l] B[l][j]
/// (A is m x l, B is l x q), with |.| taken elementwise first when `absolute`.
inline std::vector<double> matmul(const std::vector<double>& A, const std::vector<double>& B, std::int64_t m,
                                  std::int64_t l, std::int64_t q, bool absolute) {
  std::vector<double> C(static_cast<std::size_t>(m * q), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t t = 0; t < l; ++t) {
      const double a = absolute ? std::fabs(A[i * l + t]) : A[i * l + t];
      for (std::int64_t j = 0; j < q; ++j) C[i * q + j] += a * (absolute ? std::fabs(B[t * q + j]) : B[t * q + j]);
    }
  return C;
}

inline std::vector<double> transpose(const std::vector<double>& X, std::int64_t n, std::int64_t k) {
  std::vector<double> T(X.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < k; ++j) T[j * n + i] = X[i * k + j];
  return T;
}

/// The Frobenius norm of the rounding error one fp32 Newton-Schulz step adds to X_{s+1},
/// componentwise, with the probabilistic model of inner-product rounding (Higham & Mary
/// 2019: an inner product of length K errs by at most lambda sqrt(K) u sum |a_i b_i|, here
/// lambda = 4) and one rounding u per scaling and addition:
///   E_A = 4 sqrt(k) u |X||X|^T,  E_AA = |A| E_A + E_A |A| + 4 sqrt(n) u |A||A|,
///   E_B = |b| E_A + |c| E_AA + u (|b A| + |c AA| + |B|),
///   E_Y = E_B |X| + 4 sqrt(n) u |B||X| + u (|a X| + |Y|).
inline double ns_step_rounding(const std::vector<double>& X, std::int64_t n, std::int64_t k, const MuonSettings& s) {
  const double u = std::ldexp(1.0, -24), a = s.ns_coefficients[0], b = s.ns_coefficients[1],
               c = s.ns_coefficients[2];
  const std::vector<double> XT = transpose(X, n, k);
  const std::vector<double> A = matmul(X, XT, n, k, n, false), absXX = matmul(X, XT, n, k, n, true);
  const std::vector<double> AA = matmul(A, A, n, n, n, false), absAA = matmul(A, A, n, n, n, true);
  std::vector<double> EA(A.size()), B(A.size()), EB(A.size());
  for (std::size_t i = 0; i < A.size(); ++i) {
    EA[i] = 4.0 * std::sqrt(static_cast<double>(k)) * u * absXX[i];
    B[i] = b * A[i] + c * AA[i];
  }
  const std::vector<double> absA_EA = matmul(A, EA, n, n, n, true), EA_absA = matmul(EA, A, n, n, n, true);
  for (std::size_t i = 0; i < A.size(); ++i) {
    const double eaa = absA_EA[i] + EA_absA[i] + 4.0 * std::sqrt(static_cast<double>(n)) * u * absAA[i];
    EB[i] = std::fabs(b) * EA[i] + std::fabs(c) * eaa + u * (std::fabs(b * A[i]) + std::fabs(c * AA[i]) + std::fabs(B[i]));
  }
  const std::vector<double> BX = matmul(B, X, n, n, k, false), absBX = matmul(B, X, n, n, k, true),
                            EBX = matmul(EB, X, n, n, k, true);
  double sum = 0.0;
  for (std::size_t i = 0; i < X.size(); ++i) {
    const double y = a * X[i] + BX[i];
    const double e = EBX[i] + 4.0 * std::sqrt(static_cast<double>(n)) * u * absBX[i] +
                     u * (std::fabs(a * X[i]) + std::fabs(y));
    sum += e * e;
  }
  return std::sqrt(sum);
}

/// One Newton-Schulz step of ns_step with additive perturbations of its intermediates:
/// A += dA, B += dB (null: none). Used to measure how a rounding of A or B grows.
inline void ns_step_perturbed(std::vector<double>& X, std::int64_t n, std::int64_t k, const MuonSettings& s,
                              const std::vector<double>* dA, const std::vector<double>* dB) {
  const double a = s.ns_coefficients[0], b = s.ns_coefficients[1], c = s.ns_coefficients[2];
  std::vector<double> A = matmul(X, transpose(X, n, k), n, k, n, false);
  if (dA != nullptr)
    for (std::size_t i = 0; i < A.size(); ++i) A[i] += (*dA)[i];
  const std::vector<double> AA = matmul(A, A, n, n, n, false);
  std::vector<double> B(A.size());
  for (std::size_t i = 0; i < A.size(); ++i) B[i] = b * A[i] + c * AA[i] + (dB != nullptr ? (*dB)[i] : 0.0);
  const std::vector<double> BX = matmul(B, X, n, n, k, false);
  for (std::size_t i = 0; i < X.size(); ++i) X[i] = a * X[i] + BX[i];
}

/// The bound on the Frobenius error of the CUDA path's orthogonalized update of the
/// normalized x (docs/muon.md "The CUDA path's bounds"), for bf16 GEMMs (`bf16`: inputs
/// and outputs bf16, fp32 accumulation) or fp32 ones. Every stored value is rounded (bf16:
/// u_b = 2^-8, fp32: u = 2^-24): X_0, and each step's A, B and X_{s+1}; each GEMM's fp32
/// accumulation errs by the probabilistic model's 4 sqrt(K) u sum |a_i b_i| (K the inner
/// length) and its epilogue by one u per operation. Each such site's error, a matrix of
/// Frobenius norm at most
///   e_A = u_b ||A|| + 4 sqrt(k) u || |X||X|^T ||,
///   e_B = u_b ||B|| + 4 sqrt(n) u |c| || |A||A| || + u (||b A|| + ||c AA|| + ||B||),
///   e_X = u_b ||X_s+1|| + 4 sqrt(n) u || |B||X_s| || + u (||a X_s|| + ||X_s+1||)
/// (u_b = 0 for fp32 outputs: their rounding is the last u term), reaches the result through
/// the rest of the (double) iteration with a growth factor measured like update_error_bound's
/// (three pseudo-random directions of relative size 1e-7, the largest growth, times 2); to
/// first order
///   E_U = g_X0 (u_b + (6 + 3t) u) ||X_0|| + sum_s (g_A,s e_A,s + g_B,s e_B,s + g_X,s+1 e_X,s).
inline double update_error_bound_gemm(const std::vector<double>& x, std::int64_t rows, std::int64_t cols,
                                      const MuonSettings& s, int t, bool bf16) {
  const double u = std::ldexp(1.0, -24), ub = bf16 ? std::ldexp(1.0, -8) : 0.0;
  const double ca = s.ns_coefficients[0], cb = s.ns_coefficients[1], cc = s.ns_coefficients[2];
  const std::int64_t n = std::min(rows, cols), k = std::max(rows, cols);
  const double rk = std::sqrt(static_cast<double>(k)), rn = std::sqrt(static_cast<double>(n));
  const int S = s.ns_steps;
  const std::vector<std::vector<double>> Xs = ns_iterates(x, rows, cols, s);
  std::uint64_t seed = 0x2545F4914F6CDD1Dull;
  auto random_like = [&](std::size_t size) {
    std::vector<double> R(size);
    for (double& r : R) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      r = static_cast<double>(seed >> 11) / 9007199254740992.0 - 0.5;
    }
    return R;
  };
  // Growth of a perturbation entering at step st: of X_st (site 0), of A (1) or B (2) in step st.
  auto growth = [&](int st, int site, double ref) {
    if (site == 0 && st == S) return 1.0;
    double kappa = 0.0;
    for (int dir = 0; dir < 3; ++dir) {
      std::vector<double> X = Xs[static_cast<std::size_t>(st)];
      const std::vector<double> R = random_like(site == 0 ? X.size() : static_cast<std::size_t>(n * n));
      const double eps = 1e-7 * ref / frob(R);
      std::vector<double> d(R.size());
      for (std::size_t i = 0; i < R.size(); ++i) d[i] = eps * R[i];
      int from = st;
      if (site == 0) {
        for (std::size_t i = 0; i < X.size(); ++i) X[i] += d[i];
      } else {
        ns_step_perturbed(X, n, k, s, site == 1 ? &d : nullptr, site == 2 ? &d : nullptr);
        ++from;
      }
      for (int r = from; r < S; ++r) (void)ns_step(X, n, k, s);
      std::vector<double> diff(X.size());
      for (std::size_t i = 0; i < X.size(); ++i) diff[i] = X[i] - Xs.back()[i];
      kappa = std::max(kappa, frob(diff) / (eps * frob(R)));
    }
    return 2.0 * kappa;
  };
  double total = growth(0, 0, frob(Xs[0])) * (ub + (6.0 + 3.0 * t) * u) * frob(Xs[0]);
  for (int st = 0; st < S; ++st) {
    const std::vector<double>& X = Xs[static_cast<std::size_t>(st)];
    const std::vector<double>& next = Xs[static_cast<std::size_t>(st + 1)];
    const std::vector<double> XT = transpose(X, n, k);
    const std::vector<double> A = matmul(X, XT, n, k, n, false), absXX = matmul(X, XT, n, k, n, true);
    const std::vector<double> AA = matmul(A, A, n, n, n, false), absAA = matmul(A, A, n, n, n, true);
    std::vector<double> B(A.size()), bA(A.size()), cAA(A.size()), aX(X.size());
    for (std::size_t i = 0; i < A.size(); ++i) {
      bA[i] = cb * A[i];
      cAA[i] = cc * AA[i];
      B[i] = bA[i] + cAA[i];
    }
    for (std::size_t i = 0; i < X.size(); ++i) aX[i] = ca * X[i];
    const std::vector<double> absBX = matmul(B, X, n, n, k, true);
    const double eA = ub * frob(A) + 4.0 * rk * u * frob(absXX);
    const double eB = ub * frob(B) + 4.0 * rn * u * std::fabs(cc) * frob(absAA) + u * (frob(bA) + frob(cAA) + frob(B));
    const double eX = ub * frob(next) + 4.0 * rn * u * frob(absBX) + u * (frob(aX) + frob(next));
    total += growth(st, 1, frob(A)) * eA + growth(st, 2, frob(B)) * eB + growth(st + 1, 0, frob(next)) * eX;
  }
  return total;
}

/// The bound on the Frobenius error of the fp32 twin's orthogonalized update of the
/// normalized x (docs/muon.md, "The host twin's bound"): a first-order error analysis,
///   E_U = sum_{s = 0..S} kappa_s delta_s,
/// where delta_s is the rounding error step s adds to X_s (ns_step_rounding; delta_0 =
/// (6 + 3 t) u ||X_0||_F, the normalization and the momentum's rounding over the t steps
/// so far) and kappa_s how much a perturbation of X_s grows by the end of the iteration,
/// measured on the double iteration itself: the largest growth of three fixed
/// pseudo-random perturbations of relative size 1e-7, times 2 (kappa_S = 1).
inline double update_error_bound(const std::vector<double>& x, std::int64_t rows, std::int64_t cols,
                                 const MuonSettings& s, int t) {
  const double u = std::ldexp(1.0, -24);
  const std::int64_t n = std::min(rows, cols), k = std::max(rows, cols);
  const int S = s.ns_steps;
  const std::vector<std::vector<double>> Xs = ns_iterates(x, rows, cols, s);
  double total = 0.0;
  std::uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (int st = 0; st <= S; ++st) {
    double kappa = 1.0;
    if (st < S) {
      kappa = 0.0;
      for (int dir = 0; dir < 3; ++dir) {
        std::vector<double> X = Xs[static_cast<std::size_t>(st)], R(X.size());
        for (double& r : R) {
          seed = seed * 6364136223846793005ull + 1442695040888963407ull;
          r = static_cast<double>(seed >> 11) / 9007199254740992.0 - 0.5;
        }
        const double eps = 1e-7 * frob(X) / frob(R);
        for (std::size_t i = 0; i < X.size(); ++i) X[i] += eps * R[i];
        for (int r = st; r < S; ++r) (void)ns_step(X, n, k, s);
        std::vector<double> d(X.size());
        for (std::size_t i = 0; i < X.size(); ++i) d[i] = X[i] - Xs.back()[i];
        kappa = std::max(kappa, frob(d) / (eps * frob(R)));
      }
      kappa *= 2.0;
    }
    const double delta = st == 0 ? (6.0 + 3.0 * t) * u * frob(Xs[0])
                                 : ns_step_rounding(Xs[static_cast<std::size_t>(st - 1)], n, k, s);
    total += kappa * delta;
  }
  return total;
}

/// One Muon step of the oracle with gradient g (as floats), group settings and lr; adds
/// this step's share of the bound on |p - fp32 twin's p| to o.bound: lr_g ratio E_U (the
/// update; its Frobenius bound bounds every element) + 4 u max|p| (decay and update
/// roundings). `bf16_gemms`: the bound of the CUDA path's bf16 GEMMs (update_error_bound_gemm).
inline void oracle_step(OracleMatrix& o, const std::vector<double>& g, const AdamGroup& grp, double lr,
                        bool bf16_gemms = false) {
  const MuonSettings& s = grp.muon;
  std::vector<double> u(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    o.m[i] = s.momentum * o.m[i] + (1.0 - s.momentum) * g[i];
    u[i] = s.nesterov ? (1.0 - s.momentum) * g[i] + s.momentum * o.m[i] : o.m[i];
  }
  const double norm = std::max(frob(u), s.eps);
  for (double& v : u) v /= norm;
  const double eu = bf16_gemms ? update_error_bound_gemm(u, o.rows, o.cols, s, o.steps, true)
                               : update_error_bound(u, o.rows, o.cols, s, o.steps);
  u = ns_double(u, o.rows, o.cols, s);
  const double lr_g = lr * grp.lr_scale;
  const double adjusted = lr_g * (s.adjust_lr == MuonLrAdjust::Original
                                      ? std::sqrt(std::max(1.0, static_cast<double>(o.rows) / o.cols))
                                      : 0.2 * std::sqrt(static_cast<double>(std::max(o.rows, o.cols))));
  double pmax = 0.0;
  for (std::size_t i = 0; i < o.p.size(); ++i) {
    o.p[i] = o.p[i] * (1.0 - lr_g * s.weight_decay) - adjusted * u[i];
    pmax = std::max(pmax, std::fabs(o.p[i]));
  }
  o.bound += adjusted * eu + 4.0 * std::ldexp(1.0, -24) * (pmax + adjusted);
  ++o.steps;
}

/// bf16 rounding (to nearest even) of a double, via fp32 as the GPU path stores it.
inline double round_bf16(double v) {
  const float f = static_cast<float>(v);
  std::uint32_t b = 0;
  std::memcpy(&b, &f, 4);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  float r = 0.0f;
  std::memcpy(&r, &b, 4);
  return r;
}

/// An emulation of the CUDA bf16 path's Newton-Schulz on X (n x k): X rounded to bf16,
/// each GEMM accumulated in fp32 in index order, its epilogue (alpha acc + beta C) in fp32,
/// its output rounded to bf16. It differs from cuBLAS only in the order of the fp32
/// accumulation, so update_error_bound_gemm(bf16) can be checked against it on the host.
inline std::vector<double> ns_bf16_emulated(std::vector<double> X, std::int64_t n, std::int64_t k,
                                            const MuonSettings& s) {
  const float a = static_cast<float>(s.ns_coefficients[0]), b = static_cast<float>(s.ns_coefficients[1]),
              c = static_cast<float>(s.ns_coefficients[2]);
  for (double& v : X) v = round_bf16(v);
  std::vector<double> A(static_cast<std::size_t>(n * n)), B(A.size()), Y(X.size());
  for (int t = 0; t < s.ns_steps; ++t) {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (std::int64_t l = 0; l < k; ++l) acc += static_cast<float>(X[i * k + l]) * static_cast<float>(X[j * k + l]);
        A[i * n + j] = round_bf16(acc);
      }
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (std::int64_t l = 0; l < n; ++l) acc += static_cast<float>(A[i * n + l]) * static_cast<float>(A[l * n + j]);
        B[i * n + j] = round_bf16(c * acc + b * static_cast<float>(A[i * n + j]));
      }
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t l = 0; l < k; ++l) {
        float acc = 0.0f;
        for (std::int64_t j = 0; j < n; ++j) acc += static_cast<float>(B[i * n + j]) * static_cast<float>(X[j * k + l]);
        Y[i * k + l] = round_bf16(acc + a * static_cast<float>(X[i * k + l]));
      }
    X = Y;
  }
  return X;
}

}  // namespace shardopt::test::muon
