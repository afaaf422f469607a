// Shapes and tensors: validation, views, copies, devices.
#include <gtest/gtest.h>

#include <limits>

#include "remat/tensor.h"
#include "support/expect_error.h"

using remat::Device;
using remat::Shape;
using remat::Tensor;

TEST(Shape, Basics) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape().numel(), 1);
  EXPECT_EQ((Shape{0, 5}).numel(), 0);
  EXPECT_EQ((Shape{1, 2, 3, 4, 5}).numel(), 120);
}

TEST(Shape, InvalidShapesAreErrors) {
  EXPECT_REMAT_ERROR((Shape{2, -1}), "invalid shape [2, -1]: dimension 1 is negative");
  EXPECT_REMAT_ERROR((Shape{1, 2, 3, 4, 5, 6}), "rank 6 exceeds the maximum of 5");
  EXPECT_REMAT_ERROR((Shape{int64_t{1} << 40, int64_t{1} << 40}), "element count overflows int64");
  EXPECT_REMAT_ERROR(Shape({2, 3})[2], "dimension index 2 out of range for shape [2, 3]");
}

TEST(Tensor, FromVectorAndReshapeView) {
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.str(), "f32[2, 3] on cpu");
  Tensor v = t.reshape({3, -1});
  EXPECT_EQ(v.shape(), (Shape{3, 2}));
  EXPECT_TRUE(v.shares_storage(t));
  v.f32()[5] = 60;
  EXPECT_EQ(t.to_vector()[5], 60);
  EXPECT_REMAT_ERROR(t.reshape({4, 2}), "cannot reshape f32[2, 3] on cpu to [4, 2]");
  EXPECT_REMAT_ERROR(t.reshape({-1, -1}), "more than one -1");
  EXPECT_REMAT_ERROR(Tensor::from_vector({1, 2, 3}, {2, 2}), "3 values do not fill shape [2, 2]");
}

TEST(Tensor, ZerosFullCloneCopy) {
  Tensor z = Tensor::zeros({5});
  for (float v : z.to_vector()) EXPECT_EQ(v, 0.0f);
  Tensor f = Tensor::full({2, 2}, 1.5f);
  Tensor c = f.clone();
  EXPECT_FALSE(c.shares_storage(f));
  c.fill_(2.0f);
  EXPECT_EQ(f.to_vector()[0], 1.5f);
  f.copy_from(c);
  EXPECT_EQ(f.to_vector()[3], 2.0f);
  EXPECT_REMAT_ERROR(z.copy_from(f), "does not fit");
}

TEST(Tensor, StorageIsReturnedWhenLastViewDies) {
  auto& a = remat::allocator_for(Device::cpu());
  const int64_t before = a.stats().allocated;
  {
    Tensor t = Tensor::empty({1000});
    Tensor v = t.reshape({10, 100});
    t = Tensor();
    EXPECT_EQ(a.stats().allocated - before, 4096);  // v keeps it alive
  }
  EXPECT_EQ(a.stats().allocated, before);
}

TEST(Tensor, MetaTensorsHaveShapesButNoData) {
  Tensor m = Tensor::empty({4, 4}, Device::meta());
  EXPECT_EQ(m.str(), "f32[4, 4] on meta");
  EXPECT_REMAT_ERROR(m.raw_data(), "has no data");
  m.fill_(1.0f);  // no-op
  Tensor copy = Tensor::full({4, 4}, 1.0f).to(Device::meta());
  EXPECT_EQ(copy.device(), Device::meta());
  EXPECT_REMAT_ERROR(Tensor::empty({16}).copy_from(m), "cannot copy data from a meta tensor");
}

TEST(Tensor, OtherDtypesAreSizedButNotComputed) {
  Tensor h = Tensor::empty({10}, Device::cpu(), remat::DType::bf16);
  EXPECT_EQ(h.nbytes(), 20u);
  EXPECT_REMAT_ERROR(h.f32(), "is not f32");
  EXPECT_EQ(remat::parse_dtype("bf16"), remat::DType::bf16);
  EXPECT_REMAT_ERROR(remat::parse_dtype("f64"), "unknown dtype \"f64\"");
}

TEST(Tensor, UndefinedTensorUseIsAnError) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_REMAT_ERROR(t.device(), "undefined tensor");
  EXPECT_EQ(t.str(), "undefined tensor");
}
