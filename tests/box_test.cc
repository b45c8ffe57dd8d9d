// Box intersection and flat-range normalisation, checked exhaustively against a brute-force
// enumeration of cells on small shapes of 0 to 4 dimensions.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "cairn/box.h"
#include "cairn/tensor.h"

namespace cairn {
namespace {

// Row-major flat indices of the cells of `box` in a tensor of `shape`, in row-major order.
std::vector<int64_t> Cells(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  const size_t n = shape.size();
  if (box.numel() == 0) return out;
  std::vector<int64_t> idx(n, 0);
  for (;;) {
    int64_t flat = 0;
    for (size_t d = 0; d < n; ++d) flat = flat * shape[d] + box.offsets[d] + idx[d];
    out.push_back(flat);
    size_t d = n;
    while (d > 0) {
      --d;
      if (++idx[d] < box.lengths[d]) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (n == 0) return out;
  }
}

void AllShapes(size_t ndim, int64_t max_extent, Shape cur, std::vector<Shape>* out) {
  if (cur.size() == ndim) {
    out->push_back(cur);
    return;
  }
  for (int64_t e = 0; e <= max_extent; ++e) {
    cur.push_back(e);
    AllShapes(ndim, max_extent, cur, out);
    cur.pop_back();
  }
}

TEST(FlatRangeToBoxes, ExhaustiveAgainstCellEnumeration) {
  size_t cases = 0;
  for (size_t ndim = 0; ndim <= 4; ++ndim) {
    std::vector<Shape> shapes;
    AllShapes(ndim, ndim == 4 ? 3 : 4, {}, &shapes);
    for (const Shape& shape : shapes) {
      const int64_t total = NumElements(shape);
      for (int64_t b = 0; b <= total; ++b) {
        for (int64_t e = b; e <= total; ++e) {
          auto boxes = FlatRangeToBoxes(shape, b, e);
          ASSERT_TRUE(boxes.ok()) << boxes.status().ToString();
          const size_t limit = ndim == 0 ? 1 : 2 * ndim - 1;
          ASSERT_LE(boxes->size(), limit) << ShapeToString(shape) << " [" << b << "," << e << ")";
          std::vector<int64_t> got;
          for (const Box& box : *boxes) {
            ASSERT_TRUE(CheckBoxInShape(box, shape).ok()) << box.ToString();
            ASSERT_GT(box.numel(), 0) << "empty box emitted";
            auto c = Cells(shape, box);
            got.insert(got.end(), c.begin(), c.end());
          }
          std::vector<int64_t> want;
          for (int64_t i = b; i < e; ++i) want.push_back(i);
          ASSERT_EQ(got, want) << ShapeToString(shape) << " [" << b << "," << e << ")";
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 20000u);
}

TEST(FlatRangeToBoxes, LargeShapeStaysWithinLimit) {
  Shape shape = {7, 11, 13, 17};
  const int64_t total = NumElements(shape);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    int64_t b = static_cast<int64_t>(rng() % (total + 1));
    int64_t e = b + static_cast<int64_t>(rng() % (total - b + 1));
    auto boxes = FlatRangeToBoxes(shape, b, e);
    ASSERT_TRUE(boxes.ok());
    ASSERT_LE(boxes->size(), 7u);
    int64_t sum = 0;
    for (const Box& box : *boxes) sum += box.numel();
    ASSERT_EQ(sum, e - b);
  }
}

TEST(FlatRangeToBoxes, RejectsRangesOutsideTheTensor) {
  EXPECT_EQ(FlatRangeToBoxes({2, 3}, -1, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FlatRangeToBoxes({2, 3}, 4, 2).status().code(), StatusCode::kInvalidArgument);
  auto r = FlatRangeToBoxes({2, 3}, 0, 7);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[2, 3]"), std::string::npos) << r.status().message();
}

TEST(Intersect, MatchesBruteForce) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 20000; ++iter) {
    const size_t ndim = 1 + rng() % 4;
    Shape shape(ndim);
    for (auto& e : shape) e = 1 + static_cast<int64_t>(rng() % 5);
    auto random_box = [&] {
      Box b;
      for (size_t d = 0; d < ndim; ++d) {
        int64_t o = static_cast<int64_t>(rng() % static_cast<uint64_t>(shape[d]));
        int64_t l = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(shape[d] - o));
        b.offsets.push_back(o);
        b.lengths.push_back(l);
      }
      return b;
    };
    Box a = random_box(), b = random_box();
    auto ca = Cells(shape, a), cb = Cells(shape, b);
    std::set<int64_t> sa(ca.begin(), ca.end()), both;
    for (int64_t c : cb)
      if (sa.count(c)) both.insert(c);
    auto r = Intersect(a, b);
    if (both.empty()) {
      ASSERT_FALSE(r.has_value());
    } else {
      ASSERT_TRUE(r.has_value());
      auto cr = Cells(shape, *r);
      ASSERT_EQ(std::set<int64_t>(cr.begin(), cr.end()), both);
    }
  }
}

TEST(Intersect, RankMismatchAndScalars) {
  EXPECT_FALSE(Intersect(Box{{0}, {2}}, Box{{0, 0}, {2, 2}}).has_value());
  auto s = Intersect(Box{}, Box{});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->numel(), 1);
}

TEST(CheckBoxInShape, NamesTheDimension) {
  Status st = CheckBoxInShape(Box{{0, 3}, {2, 2}}, {2, 4});
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dimension 1"), std::string::npos) << st.message();
  EXPECT_TRUE(CheckBoxInShape(Box{{0, 2}, {2, 2}}, {2, 4}).ok());
  EXPECT_FALSE(CheckBoxInShape(Box{{0}, {1}}, {2, 4}).ok());
}

TEST(ShardSpec, FromFlatRangeWalksTheBuffer) {
  std::vector<float> flat(3 * 4 * 5);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i);
  TensorMeta meta{"w", DType::kF32, {3, 4, 5}};
  // A rank holding flat elements [7, 43) gets them contiguous in its buffer.
  std::vector<float> mine(flat.begin() + 7, flat.begin() + 43);
  auto shards = ShardSpec::FromFlatRange(meta, 7, 43, mine.data());
  ASSERT_TRUE(shards.ok());
  ASSERT_LE(shards->size(), 5u);
  for (const ShardSpec& s : *shards) {
    ASSERT_TRUE(CheckShard(s).ok());
    const float* p = static_cast<const float*>(s.data);
    auto cells = Cells(meta.global_shape, s.box);
    for (size_t i = 0; i < cells.size(); ++i) ASSERT_EQ(p[i], flat[static_cast<size_t>(cells[i])]);
  }
  EXPECT_FALSE(ShardSpec::FromFlatRange(meta, 50, 61, mine.data()).ok());
}

// Found by fuzz_wire: describing a hostile box (in an error message) overflowed int64.
TEST(BoxTest, ToStringDescribesMalformedBoxesWithoutOverflow) {
  Box huge{{INT64_MAX - 1}, {INT64_MAX}};
  EXPECT_EQ(huge.ToString(), "[9223372036854775806:+9223372036854775807]");
  Box ragged{{1, 2}, {3}};
  EXPECT_EQ(ragged.ToString(), "[1:4, 2:?]");
  EXPECT_EQ((Box{{}, {5}}).ToString(), "[?:+5]");
  EXPECT_FALSE(CheckBoxInShape(huge, {10}).ok());
}

}  // namespace
}  // namespace cairn
