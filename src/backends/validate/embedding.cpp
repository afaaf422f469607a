// Validators of the token (and position) embedding and its workspace query
// (src/backends/cpu/embedding.cpp).
#include "backends/validate/check.h"

namespace remat::validate {

void check_embedding_forward(const Check& ck, const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                             const Tensor& y) {
  ck.tensor("ids", ids, DType::i32);
  ck.rank("ids", ids, 2);
  ck.tensor("table", table);
  ck.rank("table", table, 2);
  ck.tensor("y", y);
  ck.shape("y", y, Shape{ids.size(0), ids.size(1), table.size(1)});
  if (pos_table.defined()) {
    ck.tensor("pos_table", pos_table);
    ck.rank("pos_table", pos_table, 2);
    if (pos_table.size(1) != table.size(1) || pos_table.size(0) < ids.size(1))
      ck.fail("pos_table " + pos_table.str() + " must be [Tmax >= " + std::to_string(ids.size(1)) + ", " +
              std::to_string(table.size(1)) + "]");
  }
}

void check_embedding_backward_workspace(const Check& ck, const Shape& dy) {
  if (dy.rank() != 3) ck.fail("dy " + dy.str() + " must be [B, T, C]");
}

void check_embedding_backward(const Check& ck, const Tensor& dy, const Tensor& ids, const Tensor& dtable,
                              const Tensor& dpos_table, const Tensor& workspace) {
  ck.tensor("ids", ids, DType::i32);
  ck.rank("ids", ids, 2);
  ck.tensor("dy", dy);
  ck.rank("dy", dy, 3);
  if (dy.size(0) != ids.size(0) || dy.size(1) != ids.size(1))
    ck.fail("dy " + dy.str() + " does not match ids " + ids.str());
  if (dtable.defined()) {
    ck.tensor("dtable", dtable);
    ck.rank("dtable", dtable, 2);
    if (dtable.size(1) != dy.size(2)) ck.fail("dtable " + dtable.str() + " and dy " + dy.str() + ": widths differ");
    ck.workspace(workspace, ck.be->embedding_backward_workspace(dy.shape()));
  }
  if (dpos_table.defined()) {
    ck.tensor("dpos_table", dpos_table);
    ck.rank("dpos_table", dpos_table, 2);
    if (dpos_table.size(1) != dy.size(2) || dpos_table.size(0) < dy.size(1))
      ck.fail("dpos_table " + dpos_table.str() + " does not fit dy " + dy.str());
  }
}

}  // namespace remat::validate
