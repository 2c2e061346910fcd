// A C++ registration cache in miniature, to probe by demangled name.
#include <cstdio>
#include <mutex>
#include <vector>

namespace rc {
class Cache {
public:
	__attribute__((noinline)) void insert(long base)
	{
		std::lock_guard<std::mutex> g(lock_);
		regions_.push_back(base);
	}
	size_t size() const { return regions_.size(); }

private:
	std::mutex lock_;
	std::vector<long> regions_;
};
} // namespace rc

int main()
{
	rc::Cache c;
	for (long i = 0; i < 3; i++)
		c.insert(i << 12);
	std::fprintf(stderr, "%zu regions\n", c.size());
	return c.size() == 3 ? 0 : 1;
}
