#include "lockstep/launch/job_identity.h"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_util.h"

namespace lockstep::launch {
namespace {

using ::testing::HasSubstr;

JobIdentity job(std::vector<std::string> program, EnvVars env = {}, std::string id = "") {
  return JobIdentity(std::move(program), std::move(env), std::move(id));
}

TEST(JobIdentity, TheSameCommandGivesTheSameDerivedIdAndAnotherCommandAnother) {
  const JobIdentity a = job({"lockstep", "train", "--lr", "0.02"}, {{"LOCKSTEP_PRECISION", "bf16"}});
  const JobIdentity b = job({"lockstep", "train", "--lr", "0.02"}, {{"LOCKSTEP_PRECISION", "bf16"}});
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.id().size(), 12u);
  EXPECT_FALSE(a.id_given());
  EXPECT_NE(a.id(), job({"lockstep", "train", "--lr", "0.90"}, {{"LOCKSTEP_PRECISION", "bf16"}}).id());
  EXPECT_NE(a.id(), job({"lockstep", "train", "--lr", "0.02"}, {{"LOCKSTEP_PRECISION", "fp32"}}).id());
  // Words are not merely joined: "a b" is one word, not two.
  EXPECT_NE(job({"sh", "-c", "a b"}).id(), job({"sh", "-c", "a", "b"}).id());
  EXPECT_EQ(a.difference(b, "node 1", "node 0"), "");
}

TEST(JobIdentity, EncodesEveryByteAndDecodesItBack) {
  const std::string odd("x\n1:2:\0y", 8);
  const JobIdentity a = job({"prog", odd, ""}, {{"A", odd}}, "run-7");
  const JobIdentity b = JobIdentity::decode(a.encode());
  EXPECT_EQ(b.id(), "run-7");
  EXPECT_TRUE(b.id_given());
  EXPECT_EQ(b.program(), a.program());
  EXPECT_EQ(a.difference(b, "node 1", "node 0"), "");
  for (const std::string bad : {std::string(""), std::string("lockstep-job/1\n"), a.encode() + "x",
                                a.encode().substr(0, a.encode().size() - 1), std::string("lockstep-job/1\n99999:ab")})
    EXPECT_THROW(JobIdentity::decode(bad), c10::Error) << bad;
}

TEST(JobIdentity, TheDifferenceNamesTheFirstDifferingArgumentAndBothValues) {
  const JobIdentity node0 = job({"lockstep", "train", "--lr", "0.02", "--epochs", "3"});
  const JobIdentity node1 = job({"lockstep", "train", "--lr", "0.90", "--epochs", "4"});
  EXPECT_EQ(node1.difference(node0, "node 1", "node 0"),
            "argument 3 of the program is '0.90' on node 1 but '0.02' on node 0; give every node the same "
            "PROGRAM [ARGS...] after --");
  EXPECT_THAT(job({"./a"}).difference(job({"./b"}), "node 1", "node 0"),
              HasSubstr("the program is './a' on node 1 but './b' on node 0"));
  EXPECT_THAT(job({"sh", "-c", "a b"}).difference(job({"sh", "-c", "a", "b"}), "node 1", "node 0"),
              HasSubstr("node 1 runs a program of 3 words (PROGRAM and its arguments) but node 0 one of 4"));
  // A long value is shown by its start and its length, never whole.
  const std::string huge(100000, 'q');
  const std::string long_difference = job({"p", huge}).difference(job({"p", "x"}), "node 1", "node 0");
  EXPECT_THAT(long_difference, HasSubstr("(100000 bytes)"));
  EXPECT_LT(long_difference.size(), 300u);
}

TEST(JobIdentity, AConfigsWorkerVariableThatDiffersIsNamed) {
  const JobIdentity bf16 = job({"lockstep", "train"}, {{"LOCKSTEP_PRECISION", "bf16"}});
  const JobIdentity none = job({"lockstep", "train"});
  EXPECT_THAT(bf16.difference(none, "node 1", "node 0"),
              HasSubstr("the workers' LOCKSTEP_PRECISION is 'bf16' on node 1 but unset on node 0"));
  EXPECT_THAT(none.difference(bf16, "node 1", "node 0"),
              HasSubstr("the workers' LOCKSTEP_PRECISION is unset on node 1 but 'bf16' on node 0"));
}

TEST(JobIdentity, OnlyAGivenIdMakesAnotherJob) {
  EXPECT_FALSE(job({"a"}).other_job(job({"b"})));  // derived ids: the same job run two ways
  EXPECT_TRUE(job({"a"}, {}, "x").other_job(job({"a"}, {}, "y")));
  EXPECT_TRUE(job({"a"}, {}, "x").other_job(job({"a"})));
  EXPECT_FALSE(job({"a"}, {}, "x").other_job(job({"b"}, {}, "x")));
  EXPECT_THAT(testing::error_message([] { job({"a"}, {}, "no spaces"); }), HasSubstr("may only hold letters"));
  EXPECT_THAT(testing::error_message([] { job({"a"}, {}, std::string(200, 'a')); }), HasSubstr("too long"));
}

}  // namespace
}  // namespace lockstep::launch
