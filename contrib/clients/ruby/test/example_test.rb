# frozen_string_literal: true

# The README's example (../example.rb) runs against a real lockd.
require "minitest/autorun"
require "tmpdir"
require_relative "conformance_test"
require_relative "../example"

class ExampleTest < Minitest::Test
  def test_the_readme_example_runs
    Dir.mktmpdir("lockd-example-") do |tmp|
      world = Conformance::World.new({ "steps" => [] }, tmp)
      begin
        ENV["LOCKD_ADDR"] = world.addr
        assert_match(/\Adeployed with fencing token \d+\z/, example)
      ensure
        ENV.delete("LOCKD_ADDR")
        world.stop
      end
    end
  end
end
