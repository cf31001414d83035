// CSV tables: features and labels as pandas would read them, and every malformed cell named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <fstream>

#include "../test_util.h"
#include "lockstep/data/csv.h"

namespace lockstep::data {
namespace {

using ::testing::HasSubstr;

std::string write(const testing::TempDir& dir, const std::string& text) {
  const std::string path = dir / "t.csv";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(Csv, ReadsFeaturesInFileOrderAndNamedLabels) {
  testing::TempDir dir;
  const CsvTable t = read_csv(write(dir, "\xEF\xBB\xBFx, species ,\"y, in cm\"\r\n1.5,setosa,2\r\n-3e2,\"virgin\"\"ica\",0.25\r\n\n"
                                         "7,setosa,8\r\n"),
                              "species");
  EXPECT_EQ(t.feature_names, (std::vector<std::string>{"x", "y, in cm"}));
  EXPECT_EQ(t.classes, (std::vector<std::string>{"setosa", "virgin\"ica"}));
  EXPECT_TRUE(torch::equal(t.features, torch::tensor({{1.5f, 2.0f}, {-300.0f, 0.25f}, {7.0f, 8.0f}})));
  EXPECT_TRUE(torch::equal(t.labels, torch::tensor({0, 1, 0}, torch::kInt64)));
}

TEST(Csv, IntegerLabelsAreTheirOwnClassIndex) {
  testing::TempDir dir;
  const CsvTable t = read_csv(write(dir, "label,a\n3,0.5\n0,1\n"), "label");
  EXPECT_EQ(t.classes, (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_TRUE(torch::equal(t.labels, torch::tensor({3, 0}, torch::kInt64)));
}

TEST(Csv, EveryMalformedInputIsRefusedNamingTheLineAndTheColumn) {
  testing::TempDir dir;
  auto message = [&](const std::string& text, const std::string& label = "label") {
    try {
      read_csv(write(dir, text), label);
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message("a,b\n1,2\n"), HasSubstr("has no column 'label' for the labels; its header names: a, b"));
  EXPECT_THAT(message("label,a\n1,2\n0,x7\n"), HasSubstr("line 3 column 'a': 'x7' is not a finite number"));
  EXPECT_THAT(message("label,a\n1,\n"), HasSubstr("line 2 column 'a': '' is not a finite number"));
  EXPECT_THAT(message("label,a\n1,nan\n"), HasSubstr("'nan' is not a finite number"));
  EXPECT_THAT(message("label,a\n1,2,3\n"), HasSubstr("line 2 has 3 fields but the header has 2"));
  EXPECT_THAT(message("label,a\n,2\n"), HasSubstr("line 2: the label ('label') is empty"));
  EXPECT_THAT(message("label,a\n1,\"2\n"), HasSubstr("line 2: a quoted field has no closing quote"));
  EXPECT_THAT(message("label,a\n"), HasSubstr("has a header but no rows"));
  EXPECT_THAT(message(""), HasSubstr("is empty"));
  // Issue 53 items 11, 12 and 7: a second column named like the label was read as a feature (the
  // label leaked); 3.5e38 became +inf in float32 and its batch was skipped every epoch; one label
  // of 999999999 made 10^9 classes (4.4 GB); a 1 GB line took 7 GB; a header of 10^7 commas 1 GB.
  EXPECT_THAT(message("label,a,label\n1,2,1\n"), HasSubstr("names column 'label' twice (columns 1 and 3)"));
  EXPECT_THAT(message("label,a,a\n1,2,3\n"), HasSubstr("names column 'a' twice (columns 2 and 3)"));
  EXPECT_THAT(message("label,a\n1,3.5e38\n"), HasSubstr("line 2 column 'a': 3.5e38 is outside float32's range"));
  EXPECT_THAT(message("label,a\n1,-3.5e38\n"), HasSubstr("-3.5e38 is outside float32's range"));
  EXPECT_EQ(message("label,a\n1,3.4e38\n"), "no error");
  EXPECT_THAT(message("label,a\n0,1\n999999999,2\n"),
              HasSubstr("label 999999999 (row 2) would make 1000000000 classes; integer labels are their own class "
                        "index, at most 99999"));
  EXPECT_EQ(message("label,a\n0,1\n99999,2\n"), "no error");
  EXPECT_THAT(message("label,a\n1," + std::string(kMaxCsvRecordBytes, '7') + "\n"),
              HasSubstr("line 2: a record longer than 16777216 bytes (the limit)"));
  EXPECT_THAT(message("label" + std::string(kMaxCsvColumns, ',') + "\n"),
              HasSubstr("line 1: more than 100000 fields (the limit)"));
  EXPECT_THAT(message("label" + std::string(10'000'000, ',') + "\n"), HasSubstr("more than 100000 fields"));
  // Not a regular file: refused by type, before a read that would wait for a writer forever.
  const std::string fifo = dir / "pipe.csv";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    read_csv(fifo, "label");
    ADD_FAILURE();
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'" + fifo + "' is not a regular file"));
  }
  try {
    read_csv(dir.path(), "label");
    ADD_FAILURE();
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not a regular file"));
  }
  try {
    read_csv(dir / "absent.csv", "label");
    ADD_FAILURE();
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot read CSV file '" + dir / "absent.csv" + "'"));
  }
}

}  // namespace
}  // namespace lockstep::data
