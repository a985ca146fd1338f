// _entry.cpp - the compiled half of a repeated rlk call on torch tensors (rlk/_entry.py builds it
// on first use against the torch in use, and loads it; nothing else includes it).
//
// A Plan is one call the package already made through its Python path, kept: the args struct as
// that call built it (every setting, descriptor shape and stride, the status word), where each
// tensor argument's data pointer goes, and how the outputs and the workspace lie. A later call
// with the same settings hands the plan its tensors: when each one has the dtype, device, sizes
// and strides the plan saw, the plan writes their pointers, allocates the outputs, writes theirs
// and calls the library; otherwise it returns None and the Python path runs (and may make a new
// plan). So what the library receives is the Python path's struct with other data pointers, and
// a call's results are the Python path's bit for bit. The plan never synchronizes, reads back or
// keeps a tensor.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

typedef int (*rlk_call_fn)(void *ctx, const void *args, void *stream);

struct In {
  int64_t at;  // byte offset of its descriptor's data pointer in the args struct; -1: must be None
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
};

struct Out {
  int64_t elem;  // element offset in the shared buffer; -1: an allocation of its own
  std::vector<int64_t> sizes, strides;
  std::vector<int64_t> at;  // byte offsets in the args struct where its data pointer goes
  at::ScalarType dtype;     // an allocation of its own: its dtype (the buffer's lie in out_dtype)
};

// A number written into each call's struct: where, and as what C type.
enum Kind { F64 = 0, F32 = 1, I32 = 2, U64 = 3 };
struct Scalar {
  int64_t at;
  Kind kind;
};

size_t kind_bytes(Kind k) { return k == F32 || k == I32 ? 4 : 8; }

at::ScalarType dtype_of(py::handle h) {
  if (!THPDtype_Check(h.ptr())) throw py::type_error("rlk plan: expected a torch.dtype");
  return reinterpret_cast<THPDtype *>(h.ptr())->scalar_type;
}

class Plan {
 public:
  Plan(py::bytes args, uintptr_t fn, uintptr_t ctx, int device_type, int device_index, py::list ins,
       py::list outs, int64_t buffer_elems, py::handle out_dtype, int64_t ws_bytes, int64_t ws_offset,
       int64_t ws_at, py::list scalars)
      : fn_(reinterpret_cast<rlk_call_fn>(fn)), ctx_(reinterpret_cast<void *>(ctx)),
        device_(static_cast<c10::DeviceType>(device_type), static_cast<c10::DeviceIndex>(device_index)),
        buffer_elems_(buffer_elems), out_dtype_(dtype_of(out_dtype)), ws_bytes_(ws_bytes),
        ws_offset_(ws_offset), ws_at_(ws_at) {
    // the struct in 8-byte words: the library reads it as its C struct, aligned as one
    const std::string bytes = args;
    args_bytes_ = bytes.size();
    args_.assign((bytes.size() + 7) / 8, 0);
    std::memcpy(args_.data(), bytes.data(), bytes.size());
    for (auto item : ins) {
      auto t = item.cast<py::tuple>();
      ins_.push_back(In{t[0].cast<int64_t>(), dtype_of(t[1]),
                        t[2].cast<std::vector<int64_t>>(), t[3].cast<std::vector<int64_t>>()});
    }
    for (auto item : outs) {
      auto t = item.cast<py::tuple>();
      outs_.push_back(Out{t[0].cast<int64_t>(), t[1].cast<std::vector<int64_t>>(),
                          t[2].cast<std::vector<int64_t>>(), t[3].cast<std::vector<int64_t>>(), dtype_of(t[4])});
      if (outs_.back().elem >= 0 && outs_.back().dtype != out_dtype_)
        throw std::invalid_argument("rlk plan: an output in the buffer of another dtype");
    }
    for (auto item : scalars) {
      auto t = item.cast<py::tuple>();
      const int k = t[1].cast<int>();
      if (k < F64 || k > U64) throw std::invalid_argument("rlk plan: a scalar of no known kind");
      scalars_.push_back(Scalar{t[0].cast<int64_t>(), static_cast<Kind>(k)});
      check_slot(scalars_.back().at, kind_bytes(scalars_.back().kind));
    }
    for (const In &in : ins_)
      if (in.at >= 0) check_slot(in.at, sizeof(void *));
    for (const Out &o : outs_)
      for (int64_t at : o.at) check_slot(at, sizeof(void *));
    if (ws_at_ >= 0) check_slot(ws_at_, sizeof(void *));
    // what lies in the one buffer lies inside it
    const int64_t es = static_cast<int64_t>(c10::elementSize(out_dtype_));
    for (const Out &o : outs_) {
      if (o.elem < 0) continue;
      int64_t end = o.elem + 1;
      for (size_t d = 0; d < o.sizes.size() && d < o.strides.size(); d++) end += (o.sizes[d] - 1) * o.strides[d];
      if (o.sizes.size() != o.strides.size() || end > buffer_elems_)
        throw std::out_of_range("rlk plan: an output outside its buffer");
    }
    if (buffer_elems_ > 0 && ws_bytes_ > 0 && (ws_offset_ < 0 || ws_offset_ + ws_bytes_ > buffer_elems_ * es))
      throw std::out_of_range("rlk plan: the workspace outside its buffer");
  }

  // The outputs (a list, in the plan's order), or None when a tensor is not what the plan saw. A
  // status other than 0 comes back as an int, the outputs dropped: the caller raises it.
  py::object call(py::tuple tensors, py::sequence scalars, uintptr_t stream) {
    if (tensors.size() != ins_.size() || scalars.size() != scalars_.size()) return py::none();
    std::vector<uint64_t> args = args_;
    char *base = reinterpret_cast<char *>(args.data());
    for (size_t i = 0; i < ins_.size(); i++) {
      const In &in = ins_[i];
      PyObject *o = tensors[i].ptr();
      if (in.at < 0) {
        if (o != Py_None) return py::none();
        continue;
      }
      if (!THPVariable_Check(o)) return py::none();
      const at::Tensor &t = THPVariable_Unpack(o);
      if (t.scalar_type() != in.dtype || t.device() != device_ || t.sizes() != in.sizes ||
          t.strides() != in.strides || t.layout() != c10::kStrided)
        return py::none();
      put(base, in.at, t.data_ptr());
    }
    for (size_t i = 0; i < scalars_.size(); i++)
      if (!put_scalar(base, scalars_[i], scalars[i])) return py::none();
    auto options = at::TensorOptions().dtype(out_dtype_).device(device_);
    at::Tensor buffer;
    char *bp = nullptr;
    if (buffer_elems_ > 0) {
      buffer = at::empty({buffer_elems_}, options);
      bp = static_cast<char *>(buffer.data_ptr());
    }
    at::Tensor ws;
    if (ws_bytes_ > 0) {
      void *w;
      if (buffer_elems_ > 0) {
        w = bp + ws_offset_;
      } else {
        ws = at::empty({ws_bytes_}, at::TensorOptions().dtype(at::kByte).device(device_));
        w = ws.data_ptr();
      }
      put(base, ws_at_, w);
    }
    const int64_t es = static_cast<int64_t>(c10::elementSize(out_dtype_));
    std::vector<at::Tensor> result;
    result.reserve(outs_.size());
    for (const Out &o : outs_) {
      at::Tensor a = o.elem >= 0 ? buffer.as_strided(o.sizes, o.strides, o.elem)
                                 : at::empty(o.sizes, o.dtype == out_dtype_ ? options : options.dtype(o.dtype));
      void *p = o.elem >= 0 ? static_cast<void *>(bp + o.elem * es) : a.data_ptr();
      for (int64_t at : o.at) put(base, at, p);
      result.push_back(std::move(a));
    }
    int status;
    {
      py::gil_scoped_release nogil;  // a host kernel runs inside the call
      status = fn_(ctx_, base, reinterpret_cast<void *>(stream));
    }
    if (status != 0) return py::int_(status);
    return py::cast(result);
  }

 private:
  void check_slot(int64_t at, size_t bytes) const {
    if (at < 0 || static_cast<size_t>(at) + bytes > args_bytes_)
      throw std::out_of_range("rlk plan: a field offset outside the args struct");
  }
  static void put(char *base, int64_t at, const void *p) { std::memcpy(base + at, &p, sizeof(p)); }
  // A Python number as the field's C type, as ctypes would store it (a negative integer's two's
  // complement for U64 and I32, so -1 is all ones); false for anything that is not such a number
  // or an integer the field cannot hold (wider than 64 or 32 bits: its low bits would be another
  // seed), which the Python path then names.
  static bool put_scalar(char *base, const Scalar &s, py::handle v) {
    PyObject *o = v.ptr();
    if (s.kind == F64 || s.kind == F32) {
      const double d = PyFloat_AsDouble(o);
      if (d == -1.0 && PyErr_Occurred()) return PyErr_Clear(), false;
      if (s.kind == F64) {
        std::memcpy(base + s.at, &d, sizeof d);
      } else {
        const float f = static_cast<float>(d);
        std::memcpy(base + s.at, &f, sizeof f);
      }
      return true;
    }
    int overflow = 0;
    const long long sv = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (sv == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
    if (overflow < 0) return false;
    unsigned long long u = static_cast<unsigned long long>(sv);
    if (overflow > 0) {  // [2^63, 2^64) fits a U64 field alone
      u = PyLong_AsUnsignedLongLong(o);
      if (PyErr_Occurred() || s.kind != U64) return PyErr_Clear(), false;
    } else if (s.kind != U64 && (sv < INT32_MIN || sv > static_cast<long long>(UINT32_MAX))) {
      return false;
    }
    if (s.kind == U64) {
      const uint64_t x = u;
      std::memcpy(base + s.at, &x, sizeof x);
    } else {
      const uint32_t x = static_cast<uint32_t>(u);
      std::memcpy(base + s.at, &x, sizeof x);
    }
    return true;
  }

  std::vector<uint64_t> args_;
  size_t args_bytes_ = 0;
  rlk_call_fn fn_;
  void *ctx_;
  c10::Device device_;
  std::vector<In> ins_;
  std::vector<Out> outs_;
  int64_t buffer_elems_;
  at::ScalarType out_dtype_;
  int64_t ws_bytes_, ws_offset_, ws_at_;
  std::vector<Scalar> scalars_;
};

}  // namespace

PYBIND11_MODULE(_rlk_entry, m) {
  py::class_<Plan>(m, "Plan")
      .def(py::init<py::bytes, uintptr_t, uintptr_t, int, int, py::list, py::list, int64_t, py::handle, int64_t, int64_t,
                    int64_t, py::list>())
      .def("__call__", &Plan::call);
}
